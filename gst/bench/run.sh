#!/usr/bin/env bash
# On the GPU machine, from the repository root (stage.sh copies this to
# .device/gst/run.sh):  bash .device/gst/run.sh
# The plugin's GPU tests, then the bench; logs and the table go to $OUT.
# At most 8.5 minutes: the tests within 150 s, the bench within 340 s (it
# skips runs that would start past 300 s: --budget-s). The bench's two
# tables, CUDA memory out (no download) first, then system memory out, with
# MPS off: 36 runs, as many as the single table with MPS on and off had.
# Arguments to run.sh come first, so they win (e.g. --mps on --memory cuda).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dev=$(dirname "$here")
OUT=${OUT:-/tmp/gst-out}
mkdir -p "$OUT"
. "$here/gstreamer/env.sh"
export VRAMRING_TEST_DATA=$here/data
export GST_REGISTRY=$OUT/registry.bin
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
gst-inspect-1.0 nvcodec 2>&1 | grep -E 'nvh264dec|cudaupload|cudadownload|cudaipc' | tee "$OUT/nvcodec.txt"
GST_PLUGIN_PATH=$here/plugin gst-inspect-1.0 vramringsink > "$OUT/inspect-vramringsink.txt" 2>&1 || rc=1
GST_PLUGIN_PATH=$here/plugin gst-inspect-1.0 vramringsrc > "$OUT/inspect-vramringsrc.txt" 2>&1 || rc=1
# The tests register the plugin statically (no GST_PLUGIN_PATH).
echo "== gpu_cuda tests"
timeout 150 "$dev/tests/test-gpu_cuda" --include-ignored --test-threads=1 2>&1 | tee "$OUT/gpu_cuda.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "== bench"
GST_PLUGIN_PATH=$here/plugin timeout 340 "$dev/examples/gst_ipc_bench" --out "$OUT" "$@" --memory cuda,system --mps off 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
# An MPS daemon the bench could not stop (killed by timeout) is stopped here.
for d in /tmp/gst-ipc-bench-mps-*/pipe; do
  [ -d "$d" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY=$d nvidia-cuda-mps-control 2>/dev/null
done
exit $rc
