#!/usr/bin/env bash
# The Python package's GPU proof on a staged machine (see python/README.md):
# a CUDA producer with Python lossless, pull and push subscribers checking
# every frame on the GPU through torch.from_dlpack, and a Python CUDA
# publisher read by the Rust consumer. Usage: bash run_h200.sh STAGED_DIR
set -uo pipefail
D=$(cd "$1" && pwd); G=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$D"/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$G
python3 -c 'import vramring, torch; print("vramring", vramring.__version__, "torch", torch.__version__)'
rc=0
echo "== 1. lossless CUDA producer, 12000 1080p frames: python lossless pull + python push"
S=/tmp/g1.sock
timeout 120 "$D"/examples/producer --socket $S --backend cuda --width 1920 --height 1080 --slots 16 --fps 0 --frames 12000 \
  --policy lossless --wait-subscribers 2 --json --report-ms 0 > /tmp/p1.json &
P=$!
timeout 120 python3 "$G"/check_gpu.py --socket $S --mode lossless --frames 12000 & A=$!
timeout 120 python3 "$G"/check_gpu.py --socket $S --mode push --frames 12000 & B=$!
wait $A || rc=1; wait $B || rc=1; wait $P || rc=1; tail -1 /tmp/p1.json
echo "== 2. overwrite CUDA producer at 1000 fps, 11000 frames: python sequential pull + python push"
S=/tmp/g2.sock
timeout 120 "$D"/examples/producer --socket $S --backend cuda --width 1920 --height 1080 --slots 16 --fps 1000 --frames 11000 \
  --wait-subscribers 2 --json --report-ms 0 > /tmp/p2.json &
P=$!
timeout 120 python3 "$G"/check_gpu.py --socket $S --mode pull --frames 11000 & A=$!
timeout 120 python3 "$G"/check_gpu.py --socket $S --mode push --frames 11000 & B=$!
wait $A || rc=1; wait $B || rc=1; wait $P || rc=1; tail -1 /tmp/p2.json
echo "== 3. cached tensors (tensors='torch'), overwrite producer at 1000 fps: python sequential pull + python push, frame.tensors checked"
S=/tmp/g4.sock
timeout 120 "$D"/examples/producer --socket $S --backend cuda --width 1920 --height 1080 --slots 16 --fps 1000 --frames 11000 \
  --wait-subscribers 2 --json --report-ms 0 > /tmp/p4.json &
P=$!
timeout 120 python3 "$G"/check_gpu.py --socket $S --mode pull --frames 11000 --tensors & A=$!
timeout 120 python3 "$G"/check_gpu.py --socket $S --mode push --frames 11000 --tensors & B=$!
wait $A || rc=1; wait $B || rc=1; wait $P || rc=1; tail -1 /tmp/p4.json
echo "== 4. python CUDA publisher (publish + loan) -> Rust consumer checking on the GPU"
S=/tmp/g3.sock
timeout 120 python3 "$G"/publish_gpu.py --socket $S --frames 2000 & A=$!
sleep 0.5
timeout 120 "$D"/examples/consumer --socket $S --mode sequential --json --report-ms 0 --timeout-ms 20000 | tail -1 || rc=1
wait $A || rc=1
echo "rc=$rc"
exit $rc
