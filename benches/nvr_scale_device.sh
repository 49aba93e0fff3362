#!/usr/bin/env bash
# Runs benches/nvr_scale.py on the GPU machine from .device/ as
# benches/nvr_stage.sh staged it: installs the staged vramring wheel into a
# private directory, checks the Python (torch with CUDA, torchvision), the
# decoder and nvidia-smi, then runs the bench with the arguments given.
# Results (one JSON file) and the table go to --out, by default $OUT.
#
#   bash benches/nvr_scale_device.sh --mps off          # both pipelines, 32 to 192 cameras, no MPS
#   bash benches/nvr_scale_device.sh --mps on           # the same under MPS
#   bash benches/nvr_scale_device.sh --mps off --pipelines host --counts 64,128,192
#
# The Python is $NVR_PYTHON, else /opt/torch/.venv/bin/python, else python3.
# Exit: the bench's (0 done, 2 bad arguments or missing files, 128+N on signal N).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${NVR_PYTHON:-/opt/torch/.venv/bin/python}
[[ -x "$py" ]] || py=$(command -v python3)
whl=$(ls -t .device/wheels/vramring-*.whl 2>/dev/null | head -1)
if [[ -z "$whl" || ! -x .device/examples/nvr_decoder ]]; then
    echo "nvr_scale_device: .device/ lacks the wheel or nvr_decoder: stage with benches/nvr_stage.sh" \
         "and carry .device" >&2
    exit 2
fi
site=$(mktemp -d /tmp/nvr-site-XXXXXX)
# A wheel with no dependencies is a zip: unpacked where PYTHONPATH looks
# (pip --target does the same, where the venv has pip).
"$py" -m zipfile -e "$whl" "$site" || exit 1
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
NVR_WHEEL=$whl "$py" - <<'PY' || exit 1
import os, sys, torch, torchvision, vramring
print(f"python {sys.version.split()[0]} torch {torch.__version__} torchvision {torchvision.__version__} "
      f"vramring {vramring.__version__} from {vramring.__file__}")
if not hasattr(vramring.Frame, "tensors"):
    sys.exit(f"nvr_scale_device: the staged wheel {os.environ['NVR_WHEEL']} lacks Frame.tensors, which the "
             "readers use: rerun `bash benches/nvr_stage.sh` without --no-wheel and carry .device again")
if not torch.cuda.is_available():
    sys.exit("nvr_scale_device: torch sees no CUDA GPU")
PY
# Every ring the readers join holds file descriptors (its socket, the
# memory it maps, push buffers): raise the soft limit to the hard one.
soft=$(ulimit -Sn) hard=$(ulimit -Hn)
if [[ "$hard" == unlimited ]]; then
    hard=$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)
fi
if ! ulimit -Sn "$hard" 2>/dev/null; then
    echo "nvr_scale_device: could not raise the open-files limit from $soft to $hard" >&2
fi
echo "nvr_scale_device: open files: soft limit $(ulimit -Sn) (was $soft), hard limit $(ulimit -Hn)"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || exit 1
out=${OUT:-/tmp/nvr-scale-out}
mkdir -p "$out"
log="$out/nvr_scale_$(date +%Y%m%d-%H%M%S).log"
# The bench in the background so that a signal to this script reaches it
# (it then stops its processes and quits MPS); its output also in $log.
# The sweep 32 to 192 cameras, every count even after one gave (a first
# run must say what limits each pipeline); --budget-s 420 and --stop-grace
# 10 (readers closing 192 subscriptions): the sweep, its last point,
# stopping every process and quitting MPS end well within the 10 minutes of
# one command, this script's checks included (later arguments win). The
# processes' logs stay in $work and come back as one archive.
work=/tmp/nvr-scale-work
rm -rf "$work"
"$py" benches/nvr_scale.py --examples .device/examples --python "$py" --out "$out/" \
    --counts 32,64,128,192 --budget-s 420 --stop-grace 10 --keep-going --work-dir "$work" "$@" \
    > >(tee -a "$log") 2>&1 &
bench=$!
trap 'kill -TERM "$bench" 2>/dev/null' TERM INT HUP
wait "$bench"
rc=$?
while kill -0 "$bench" 2>/dev/null; do   # a trapped signal ended the wait, not the bench
    wait "$bench"
    rc=$?
done
rm -rf "$site"
tar czf "$out/nvr_scale_logs.tgz" --exclude='*.sock' -C "$(dirname "$work")" "$(basename "$work")" 2>/dev/null
rm -rf "$work"
exit "$rc"
