#!/usr/bin/env bash
# On the GPU machine, from the repository root (stage.sh copies this to
# .device/gst/run.sh):  bash .device/gst/run.sh [BENCH ARGS...]
# The plugin's GPU tests (TESTS=0 skips them), the GPU floor of benches/wake.rs
# (one copy plus a stream write, busy-polled: 1080p NV12 at 2 ms and 25 fps,
# when .device/benches/wake is staged), then the bench; logs and tables go
# to $OUT. Tests one process each within 60 s (seconds when they pass), the floor within 75 s,
# the bench within 340 s (it skips runs that would start past --budget-s,
# 300 by default). By default the CUDA-memory table (no download) with MPS
# off; arguments to run.sh come after these defaults, so they win
# (e.g. `TESTS=0 bash .device/gst/run.sh --mps on`).
# Everything is written to $W; $OUT gets the table, the test and floor logs
# and one archive of the rest (the device tool brings back 8 files at most).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dev=$(dirname "$here")
OUT=${OUT:-/tmp/gst-out}
W=/tmp/gst-run
rm -rf "$W"
mkdir -p "$OUT" "$W"
pack() {
  cp "$W"/gst-ipc-bench.md "$W"/gpu_cuda.log "$W"/floor.log "$OUT"/ 2>/dev/null
  tar czf "$OUT/gst-run.tgz" --exclude=registry.bin -C /tmp gst-run
}
trap pack EXIT
. "$here/gstreamer/env.sh"
export VRAMRING_TEST_DATA=$here/data
export GST_REGISTRY=$W/registry.bin
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>&1 | tee "$W/gpu.txt"
gst-inspect-1.0 nvcodec 2>&1 | grep -E 'nvh264dec|cudaupload|cudadownload|cudaipc' | tee "$W/nvcodec.txt"
GST_PLUGIN_PATH=$here/plugin gst-inspect-1.0 vramringsink > "$W/inspect-vramringsink.txt" 2>&1 || rc=1
GST_PLUGIN_PATH=$here/plugin gst-inspect-1.0 vramringsrc > "$W/inspect-vramringsrc.txt" 2>&1 || rc=1
# The tests register the plugin statically (no GST_PLUGIN_PATH).
if [ "${TESTS:-1}" != 0 ]; then
  # One process per test, 60 s each: a test that hangs (the zero-copy
  # one did, 2026-12-05) leaves the others their run.
  echo "== gpu_cuda tests"
  for t in $("$dev/tests/test-gpu_cuda" --list --ignored 2>/dev/null | sed -n 's/: test$//p'); do
    # Hopper (H100, H200) has no NVENC, so nvcodec registers no encoder.
    # (Only where nvcodec itself loaded: its decoder is there.)
    if [[ $t == *nvh264enc* ]] && gst-inspect-1.0 nvh264dec >/dev/null 2>&1 \
        && ! gst-inspect-1.0 nvh264enc >/dev/null 2>&1; then
      echo "NOT RUN: $t (no nvh264enc: this GPU has no NVENC)" | tee -a "$W/gpu_cuda.log"
      continue
    fi
    timeout 60 "$dev/tests/test-gpu_cuda" --include-ignored --exact "$t" 2>&1 | tee -a "$W/gpu_cuda.log"
    [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; echo "FAILED or timed out: $t" | tee -a "$W/gpu_cuda.log"; }
  done
fi
if [ -x "$dev/benches/wake" ]; then
  echo "== GPU floor (benches/wake.rs)"
  timeout 75 "$dev/benches/wake" --backend cuda --quick --waits gpu,spin --cadences 2000,40000 --frames 300 --out "$W/wake" 2>&1 | tail -30 | tee "$W/floor.log"
fi
echo "== bench"
GST_PLUGIN_PATH=$here/plugin timeout 340 "$dev/examples/gst_ipc_bench" --memory cuda --mps off --out "$W" "$@" 2>&1 | tee "$W/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
# An MPS daemon the bench could not stop (killed by timeout) is stopped here.
for d in /tmp/gst-ipc-bench-mps-*/pipe; do
  [ -d "$d" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY=$d nvidia-cuda-mps-control 2>/dev/null
done
exit $rc
