#!/usr/bin/env bash
# One device call of GPU tests and benchmarks, chosen by $SET (the issue each set closes is named beside it). Each step
# runs under its own time limit (SIGINT, then the next step) with its full output in $OUT/<step>.txt and one line in
# $OUT/summary.txt (exit status, seconds). The tests run with torch unimportable (PYTHONPATH=/tmp/notorch, see
# gpu_env.sh); the benchmarks' torch peers run in their own processes.
#   SET=core     bash benchmarks/gpu_check.sh   # #9, #4, #6: judge/warm/reliability, rows/elementwise, bench_autotune
#   SET=families bash benchmarks/gpu_check.sh   # #11: sampling, quant, moe, vision tests and benchmarks
#   SET_A=s5a SET_B=s5b bash benchmarks/gpu_pair.sh  # the fourth session's leftovers, on two GPUs; then SET=s5c alone
# (the sets of earlier calls, rest/last/next/next2/next3, are in the history at the commits RESULTS.md names)
set -u
source "$(dirname "$0")/gpu_env.sh"
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  tail -4 "$OUT/$name.txt"
}
TESTS=(env PYTHONPATH=/tmp/notorch python3 -m pytest -q -p no:cacheprovider -m gpu --durations=12)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
case "${SET:-}" in
  core)
    step tests_core 150 "${TESTS[@]}" tests/test_judge.py tests/test_warm.py tests/test_reliability.py
    step tests_rows_elementwise 230 "${TESTS[@]}" tests/kernels/test_rows.py tests/kernels/test_elementwise.py
    [ "${AUTOTUNE:-1}" = 1 ] && step bench_autotune 190 python3 benchmarks/bench_autotune.py --keys 6 --out "$OUT/autotune.json"
    ;;
  families)
    step tests_families 280 "${TESTS[@]}" tests/kernels/test_sampling.py tests/kernels/test_quant.py \
      tests/kernels/test_moe.py tests/kernels/test_vision.py
    step bench_sampling 50 python3 benchmarks/bench_sampling.py --warmup 10 --rep 40 --out "$OUT/bench_sampling.json"
    step bench_quant 50 python3 benchmarks/bench_quant.py --warmup 10 --rep 40 --out "$OUT/bench_quant.json"
    step bench_vision 50 python3 benchmarks/bench_vision.py --warmup 10 --rep 40 --out "$OUT/bench_vision.json"
    step bench_moe 120 python3 benchmarks/bench_moe.py --warmup-ms 10 --rep-ms 40 --out "$OUT/bench_moe.json" \
      --shapes mixtral:up:64,mixtral:down:512,qwen3:up:512,qwen3:down:64
    ;;
  s5a)  # what the fourth session left, tests (#11, #5): fused_moe at 512 tokens (out of memory then: the compile
        # workers kept their inputs; fixed) and the attention tests with the TMA candidates
    step tests_moe 300 "${TESTS[@]}" tests/kernels/test_moe.py -k "fused_moe or group_m"
    step tests_attention 250 "${TESTS[@]}" tests/kernels/test_attention.py
    ;;
  s5b)  # ... and benchmarks (#4, #11): the element-wise table with torch's column (and the int32 cast), bench_moe's
        # five unmeasured shapes (about 23 s a shape in the fourth session), sampling with topk's radix variant
    step bench_elementwise 150 python3 benchmarks/bench_elementwise.py --warmup 10 --rep 40 \
      --out "$OUT/bench_elementwise.json"
    step bench_moe 200 python3 benchmarks/bench_moe.py --warmup-ms 10 --rep-ms 40 --out "$OUT/bench_moe.json" \
      --shapes qwen3:up:4096,qwen3:down:1,qwen3:down:64,qwen3:down:512,qwen3:down:4096
    step bench_sampling 110 python3 benchmarks/bench_sampling.py --warmup 10 --rep 40 --out "$OUT/bench_sampling.json"
    step tests_topk 90 "${TESTS[@]}" tests/kernels/test_sampling.py -k topk
    ;;
  s5c)  # #3: bench_matmul alone on the machine (its fourth-session run shared the host with bench_attention)
    step bench_matmul 250 python3 benchmarks/bench_matmul.py --out "$OUT/bench_matmul.json"
    ;;
  *) echo "SET must be core, families, s5a, s5b or s5c" >&2; exit 2 ;;
esac
