#!/usr/bin/env bash
# The GPU check, run on a lent device machine from the repo root with `.whl` carried
# (prepare it here with scripts/gpu_wheels.sh). Writes JSON and logs under $OUT.
#   device run: bash scripts/gpu_check.sh                 (all stages, timeout ~590 s)
#               STAGES="bench loadtest" bash scripts/gpu_check.sh
# Stages, each on synthetic:1.5 in bf16 on CUDA (generator and vocoder on their own streams):
#   bench     streamtts bench --json: per-stage figures, the roofline and the generator/vocoder
#             overlap, eager
#   compiled  the same with --compile (CUDA graphs per batch bucket: reduce-overhead)
#   engine    loadtest.engine_bench: TTFA (median of 10), real-time factor at 1..48 streams
#   loadtest  python -m loadtest --spawn: 1..48 WebSocket clients at LLM token cadence with a
#             playback clock (TTFA p50/p95/p99, underruns); draw the chart here from the JSON:
#             python -c 'import json; from loadtest.__main__ import chart;
#               chart(json.load(open("loadtest.json"))["levels"], "loadtest.png", "H200")'
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
stages="${STAGES:-bench engine loadtest compiled}"
mkdir -p "$out"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
status=0
run_stage() {  # name, timeout_s, command...
    local name=$1 limit=$2
    shift 2
    case " $stages " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name (at most $limit s)" >&2
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log" || { echo "!! $name failed" >&2; status=1; }
}
run_stage bench 120 sh -c "python3 -m streamtts bench --device cuda --dtype bf16 --json \
    > '$out/bench.json'"
run_stage engine 200 python3 -m loadtest.engine_bench --model synthetic:1.5 --device cuda \
    --dtype bf16 --runs 10 --streams 1 8 16 32 48 \
    --json "$out/engine_bench.json"
run_stage loadtest 180 env STREAMTTS_DEVICE=cuda STREAMTTS_DTYPE=bf16 STREAMTTS_MAX_STREAMS=48 \
    python3 -m loadtest --spawn --model synthetic:1.5 --levels 1 8 16 32 48 --utterances 1 \
    --json "$out/loadtest.json" --png ""
# perf_hints logs "skipping cudagraphs due to ..." if a bucket does not become a CUDA graph.
run_stage compiled 240 sh -c "TORCH_LOGS=perf_hints python3 -m streamtts bench --device cuda \
    --dtype bf16 --compile --json > '$out/bench_compiled.json'"
exit $status
