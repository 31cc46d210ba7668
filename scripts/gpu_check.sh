#!/usr/bin/env bash
# The GPU check, run on a lent device machine from the repo root with `.whl` carried
# (prepare it here with scripts/gpu_wheels.sh). Writes JSON under $OUT.
#   device run: bash scripts/gpu_check.sh      (timeout ~540 s)
# Measures, on synthetic:1.5 in bf16 on CUDA with the two worker threads on their own CUDA
# streams: load time, TTFA for a 60-character sentence (median of 10), worst/median real-time
# factor at 1..48 concurrent streams, and generator/vocoder overlap.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
timeout 480 python3 -m loadtest.engine_bench --model synthetic:1.5 --device cuda --dtype bf16 \
    --runs 10 --streams 1 8 16 32 48 --overlap-frames 180 --json "$out/engine_bench.json" \
    2>&1 | tee "$out/engine_bench.log"
