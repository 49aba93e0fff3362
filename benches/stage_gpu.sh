#!/usr/bin/env bash
# Stages, in one .device/, every GPU proof the open issues still need, under
# the 64 MiB that may travel to the GPU machine:
#   * the NVR scale bench and GPU tests, the Python wheel, and the producer /
#     consumer examples the Python checks and latency bench start
#     (benches/nvr_stage.sh);
#   * the GStreamer plugin's GPU tests, its bench, the GPU floor and
#     GStreamer 1.28 with nvcodec (gst/bench/stage.sh).
#
#   bash benches/stage_gpu.sh [GST_DIR]   # GST_DIR: shared/vendor/gstreamer/build.sh's output (default /tmp/gst-h200)
#
# Then, on the GPU machine, one command each (see the scripts named):
#   bash .device/gst/run.sh                          # gst/bench/README.md
#   TESTS=0 bash .device/gst/run.sh --mps on
#   bash benches/nvr_scale_device.sh --mps off       # benches/nvr_scale.py
#   bash benches/nvr_scale_device.sh --mps on
#   VRAMRING_TEST_DATA=tests/data bash .device/run.sh tests gpu_nvr
#   export PATH=/opt/torch/.venv/bin:$PATH; bash python/gpu/run_h200.sh .device
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
gst=${1:-/tmp/gst-h200}
keep=.device.nvr
# An untracked folder would travel with the working tree: never leave it.
trap 'rm -rf "$keep"' EXIT
bash benches/nvr_stage.sh
rm -rf "$keep"
mv .device "$keep"
../shared/tools/device-stage -p gst-plugin-vramring
gst/bench/stage.sh "$gst"
cp -a "$keep/examples/." .device/examples/
cp -a "$keep/tests/." .device/tests/
cp -a "$keep/wheels" .device/
bytes=$(du -sb .device | cut -f1)
limit=$((64 * 1024 * 1024))
ls .device/examples .device/tests .device/benches .device/wheels
echo "staged $((bytes / 1024 / 1024)) MiB in .device"
if [ "$bytes" -gt "$limit" ]; then
    echo "stage_gpu: .device is over 64 MiB: carry it in two runs (benches/nvr_stage.sh, gst/bench/stage.sh)" >&2
    exit 1
fi
