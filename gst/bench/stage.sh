#!/usr/bin/env bash
# Adds to .device/ what the plugin's GPU tests and bench need beyond the
# binaries `device-stage` staged: the GPU floor (benches/wake.rs), the plugin
# library, GStreamer 1.28 with
# nvcodec (built by shared/vendor/gstreamer/build.sh, without headers and
# pkg-config files), the test clip and its framemd5, and gst/run.sh.
#
#   ../shared/tools/device-stage -p gst-plugin-vramring
#   gst/bench/stage.sh [GST_DIR]    # GST_DIR: build.sh's output (default /tmp/gst-h200; built when missing)
#
# Keeps only the plugin's GPU test binary (the others need no GPU), so that
# .device/ stays under 60 MiB.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
gst=${1:-/tmp/gst-h200}
dev=.device
[ -d "$dev/tests" ] || { echo "run ../shared/tools/device-stage -p gst-plugin-vramring first" >&2; exit 1; }
[ -f "$gst/env.sh" ] || "$root/../shared/vendor/gstreamer/build.sh" "$gst"
cargo build --release -p gst-plugin-vramring --lib
find "$dev/tests" -type f ! -name 'test-gpu_cuda' -delete
rm -rf "$dev/gst"; mkdir -p "$dev/gst/plugin" "$dev/gst/data" "$dev/gst/gstreamer"
cp target/release/libgstvramring.so "$dev/gst/plugin/"
strip "$dev/gst/plugin/libgstvramring.so"
cp -a "$gst/env.sh" "$gst/lib" "$dev/gst/gstreamer/"
mkdir -p "$dev/gst/gstreamer/prefix"
cp -a "$gst/prefix/bin" "$gst/prefix/lib" "$dev/gst/gstreamer/prefix/"
[ -d "$gst/prefix/libexec" ] && cp -a "$gst/prefix/libexec" "$dev/gst/gstreamer/prefix/"
rm -rf "$dev/gst/gstreamer/prefix/lib/x86_64-linux-gnu/pkgconfig"
cp tests/data/clip.h264 tests/data/clip.nv12.framemd5 "$dev/gst/data/"
cp gst/bench/run.sh "$dev/gst/run.sh"
# The GPU floor run.sh measures in the same run: benches/wake.rs.
wake=$(cargo bench --no-run -p vramring-benches --bench wake --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "wake":
        print(m["executable"])')
mkdir -p "$dev/benches"; cp "$wake" "$dev/benches/wake"; strip "$dev/benches/wake"
chmod +x "$dev/gst/run.sh"
du -sh "$dev"/gst/* "$dev"/tests "$dev"/examples "$dev"/benches
du -sh "$dev"
