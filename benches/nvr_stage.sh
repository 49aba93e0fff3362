#!/usr/bin/env bash
# Stages, in .device/, what the NVR scale bench (benches/nvr_scale.py) and
# the NVR GPU tests need on a GPU machine without a Rust toolchain, under the
# 64 MiB that may travel:
#
#   .device/examples/  nvr_decoder (built with --features nvdec), packet_producer,
#                      nvdec_producer, producer, consumer
#   .device/tests/     test-gpu_nvr, test-gpu_nvdec, test-nvdec_unavailable
#   .device/wheels/    the vramring wheel (maturin build --release in python/)
#   .device/run.sh     device-stage's runner
#
# It builds the wheel, stages with ../shared/tools/device-stage --features
# nvdec (every test, example and bench binary, release), then keeps only the
# files above and checks the total. With --no-build it skips device-stage and
# prunes a .device/ staged before (with --features nvdec); with --no-wheel
# it uses the newest wheel already in target/wheels.
#
#   bash benches/nvr_stage.sh [--no-build] [--no-wheel]
#
# Then, on the GPU machine (the working tree travels; .device/ with it when
# named in carry), one command per MPS setting, each under 10 minutes:
#   bash benches/nvr_scale_device.sh --mps off
#   bash benches/nvr_scale_device.sh --mps on
#   VRAMRING_TEST_DATA=tests/data bash .device/run.sh tests gpu_nvr
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
build=1 wheel=1
for arg in "$@"; do
    case "$arg" in
        --no-build) build=0 ;;
        --no-wheel) wheel=0 ;;
        *) echo "usage: bash benches/nvr_stage.sh [--no-build] [--no-wheel]" >&2; exit 2 ;;
    esac
done
limit=$((64 * 1024 * 1024))
examples=(nvr_decoder packet_producer nvdec_producer producer consumer)
tests=(test-gpu_nvr test-gpu_nvdec test-nvdec_unavailable)

if [[ $wheel -eq 1 ]]; then
    maturin=$(command -v maturin || true)
    [[ -n "$maturin" ]] || maturin=$root/python/target/ci-venv/bin/maturin
    if [[ ! -x "$maturin" ]]; then
        echo "nvr_stage: maturin is not here: install it (python3 -m venv python/target/ci-venv &&" \
             "python/target/ci-venv/bin/pip install maturin), or pass --no-wheel" >&2
        exit 2
    fi
    # maturin writes to the workspace's target/wheels (device-stage also
    # looks in python/target/wheels): old wheels there would travel too.
    rm -f target/wheels/vramring-*.whl python/target/wheels/vramring-*.whl
    (cd python && "$maturin" build --release --quiet)
fi
whl=$(ls -t target/wheels/vramring-*.whl python/target/wheels/vramring-*.whl 2>/dev/null | head -1 || true)
if [[ -z "$whl" ]]; then
    echo "nvr_stage: no vramring wheel in target/wheels: run without --no-wheel" >&2
    exit 2
fi

if [[ $build -eq 1 ]]; then
    ../shared/tools/device-stage --features nvdec
fi
if [[ ! -x .device/examples/nvr_decoder ]]; then
    echo "nvr_stage: .device/examples/nvr_decoder is missing: stage with --features nvdec (run without --no-build)" >&2
    exit 2
fi

keep() { local want=$1; shift; for k in "$@"; do [[ "$k" == "$want" ]] && return 0; done; return 1; }
for f in .device/examples/* .device/tests/* .device/benches/*; do
    [[ -e "$f" ]] || continue
    name=$(basename "$f")
    case "$f" in
        .device/examples/*) keep "$name" "${examples[@]}" && continue ;;
        .device/tests/*) keep "$name" "${tests[@]}" && continue ;;
    esac
    rm -f "$f"
done
strip .device/examples/* .device/tests/* 2>/dev/null || true   # device-stage did; cheap to be sure
rm -rf .device/wheels
mkdir -p .device/wheels
cp "$whl" .device/wheels/
for need in "${examples[@]/#/examples/}" "${tests[@]/#/tests/}"; do
    [[ -x ".device/$need" ]] || { echo "nvr_stage: .device/$need is missing after staging" >&2; exit 1; }
done
bytes=$(du -sb .device | cut -f1)
echo "nvr_stage: .device/ holds $((bytes / 1024 / 1024)) MiB (limit 64 MiB):"
(cd .device && find . -type f | sort | sed 's/^\.\//  /')
if [[ $bytes -gt $limit ]]; then
    echo "nvr_stage: .device/ is over 64 MiB" >&2
    exit 1
fi
