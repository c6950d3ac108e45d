#!/usr/bin/env bash
# One device call of GPU tests and benchmarks, chosen by $SET (the issue each set closes is named beside it). Each step
# runs under its own time limit (SIGINT, then the next step) with its full output in $OUT/<step>.txt and one line in
# $OUT/summary.txt (exit status, seconds). The tests run with torch unimportable (PYTHONPATH=/tmp/notorch, see
# gpu_env.sh); the benchmarks' torch peers run in their own processes.
#   SET=core     bash benchmarks/gpu_check.sh   # #9, #4, #6: judge/warm/reliability, rows/elementwise, bench_autotune
#   SET=families bash benchmarks/gpu_check.sh   # #11: sampling, quant, moe, vision tests and benchmarks
#   SET=first    bash benchmarks/gpu_check.sh   # timer and plans GPU tests, serving (#8), bench_matmul (#3): one H200
#   SET=second   bash benchmarks/gpu_check.sh   # block reuse, in-kernel index checks, new plans, max_len; serving
#   SET=matmul   bash benchmarks/gpu_check.sh   # #3: bench_matmul.py alone on a machine of one H200
#   SET_A=matmul SET_B=mistral_attention bash benchmarks/gpu_pair.sh   # #3 beside #8's mistral verify and attention
#   SET_A=matmul SET_B=matmul_tests bash benchmarks/gpu_pair.sh   # #3: bench_matmul beside the matmul GPU tests
#   SET=matmul_alone bash benchmarks/gpu_check.sh   # #3: matmul GPU tests, then bench_matmul, on one H200
#   SET=sq       bash benchmarks/gpu_check.sh   # #11, #4: sampling, quant and element-wise GPU tests
#   SET=moe      bash benchmarks/gpu_check.sh   # #11: fused_moe GPU tests and bench_moe at Qwen3 4096 tokens
#   SET_A=quality SET_B=quality QUALITY_OF=2 WORKLOAD=tinyllama-1.1b bash benchmarks/gpu_pair.sh   # #8: quality
#   SET=cold WORKLOAD=tinyllama-1.1b bash benchmarks/gpu_check.sh   # #8: cold start, its three runs over the GPUs
# (the sets of earlier calls, rest/last/next/next2/next3/s5a/s5b/s5c, are in the history at the commits RESULTS.md
# names)
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
  return $rc
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
  first)  # the seventh session's code on the card before anything is certified with it: the stream-gated timer and
          # the launch plans' direct replay (GPU tests), the serving overhead with its profile, then #3's bench_matmul
          # (run this set on a machine of one H200, alone)
    step tests_gate_plans 150 "${TESTS[@]}" tests/backends/test_cuda.py tests/test_served_plans.py
    step serving 100 env PYTHONPATH=/tmp/notorch python3 benchmarks/bench_certified.py serving --profile \
      --out "$OUT/serving.json"
    step bench_matmul 250 python3 benchmarks/bench_matmul.py --out "$OUT/bench_matmul.json"
    ;;
  second)  # the eighth session's code on the card before anything is certified with it: freed blocks reused
           # (cached_alloc), embedding/rope/decode attention checking their indices in the kernel (faults read at
           # synchronisations, pinned device-mapped words), plans for embedding, rope and the split softmax, decode
           # attention's max_len; then the serving overhead (the allocating path included)
    # (test_cuda.py apart and after: its stream tests end the block cache for their process)
    step tests_second 300 "${TESTS[@]}" tests/test_served_plans.py tests/kernels/test_elementwise.py \
      tests/kernels/test_attention.py -k "not every_kept or embedding or rope or decode or paged"
    step tests_cuda 100 "${TESTS[@]}" tests/backends/test_cuda.py
    step serving 100 env PYTHONPATH=/tmp/notorch python3 benchmarks/bench_certified.py serving --profile \
      --out "$OUT/serving.json"
    ;;
  matmul)  # #3 on a machine of one H200, alone: the fourth to eighth sessions' runs timed the 4096^3 winner 10% slower
           # than the second session's did; since the ninth, the ratio comes from alternating rounds after the sweep
           # (bench_matmul.py --rounds), each side in a fresh process after an idle spell, the card's clocks recorded
    step bench_matmul 420 python3 benchmarks/bench_matmul.py --out "$OUT/bench_matmul.json"
    ;;
  matmul_tests)  # #3: every kept matmul candidate at the issue's real shapes against the float64 oracle (the TMA-store
                 # epilogue, C_TMA, among them), and the no-bit claims
    step tests_matmul 420 "${TESTS[@]}" tests/kernels/test_matmul.py
    ;;
  matmul_alone)  # #3 on a machine of one H200: matmul_tests, then matmul (the eleventh session's calls 3-5)
    step tests_matmul 240 "${TESTS[@]}" tests/kernels/test_matmul.py
    step bench_matmul 330 python3 benchmarks/bench_matmul.py --out "$OUT/bench_matmul.json"
    ;;
  mistral_attention)  # #8, one GPU (the other running SET=matmul through gpu_pair.sh): mistral-7b's 32 keys that are
                      # not llama-3-8b's (14 are tinyllama-1.1b's logits softmax) verified certified-only in their 0.4.0
                      # entries, then tinyllama-1.1b's attention keys' quality against the corrected SDPA peer; first
                      # the block cache's GPU tests again (its blocks now given back through a queue, ninth session)
    step tests_blocks 90 "${TESTS[@]}" tests/test_served_plans.py tests/backends/test_cuda.py
    step verify_mistral_own 150 env SHARDS=1 GPU_BASE="${CUDA_VISIBLE_DEVICES:-0}" PER_GPU=1 VERIFY_S=140 \
      KEYS=benchmarks/mistral-7b_not_llama-3-8b.jsonl WORKLOADS=mistral-own bash "$(dirname "$0")/gpu_verify.sh"
    step quality_attention 300 python3 benchmarks/bench_certified.py quality --workload tinyllama-1.1b \
      --dir certificates --kernels flash_attention,decode_attention --jobs $(( $(nproc) / 2 )) \
      --out "$OUT/quality_attention.json"
    ;;
  sq)  # #11 and #4: every kept candidate of sampling, quant and the element-wise kernels on the card, the code changed
       # since the third session's run included (dequant_gemv split-K, log_softmax/cross_entropy split, topk radix,
       # cast through 32-bit integers)
    step tests_sampling_quant 320 "${TESTS[@]}" tests/kernels/test_sampling.py tests/kernels/test_quant.py
    step tests_elementwise 200 "${TESTS[@]}" tests/kernels/test_elementwise.py
    ;;
  moe)  # #11: every kept fused_moe candidate on the card again (one added after the fifth session's run: the 128x256x64
        # tile with GROUP_M 1), and bench_moe at the two shapes where that config was vLLM's best
    step tests_moe 300 "${TESTS[@]}" tests/kernels/test_moe.py -k "fused_moe or group_m"
    step bench_moe 120 python3 benchmarks/bench_moe.py --warmup-ms 10 --rep-ms 40 --out "$OUT/bench_moe.json" \
      --shapes qwen3:up:4096,qwen3:down:4096
    ;;
  cold)  # #8's cold start for $WORKLOAD: the certified and warmed runs at once, then the swept and autotuned runs
        # at once, dealt over the GPUs (no certified run shares the host with a sweep's compile workers); the warmed
        # run compiles its winners in the background (nbxcert.warm.start; COLD_WARM=block: before the first launch),
        # whose GPU tests run first
    gpus=$(seq -s, 0 $(( $(nvidia-smi -L | wc -l) - 1 )))
    step tests_warm 90 "${TESTS[@]}" tests/test_warm.py -k start
    step coldstart 580 python3 benchmarks/bench_certified.py coldstart --workload "${WORKLOAD:?}" --dir certificates \
      --gpus "$gpus" --certified-limit 150 --sweep-limit "${COLD_SWEEP_S:-360}" --autotune \
      --warm "${COLD_WARM:-background}" --out "$OUT/coldstart.json"
    ;;
  quality)  # #8's first measurement for $WORKLOAD, one shard of its keys per GPU: run it through gpu_pair.sh
            # (SET_A=quality SET_B=quality QUALITY_OF=2), each shard taking the GPU it was given and half the cores;
            # a workload too long for one call in more shards: QUALITY_OF=4 QUALITY_FIRST=0, then QUALITY_FIRST=2;
            # QUALITY_KERNELS=flash_attention,decode_attention: those kernels' keys alone
    # (and on GPU 0 first, #8's third measurement: the serving overhead with its profile, ~30 s, and the host cost of
    # an allocated output, bench_alloc.py, ~5 s). The quality run measures no key after QUALITY_STOP seconds (the
    # time left, less PEER_S for the peer over the keys measured); QUALITY_START_<gpu>=N goes on from where that GPU's
    # stopped run said.
    of=${QUALITY_OF:-1}
    start_var=QUALITY_START_${CUDA_VISIBLE_DEVICES:-0}
    t0=$(date +%s)
    if [ "${CUDA_VISIBLE_DEVICES:-0}" = 0 ]; then
      step serving 100 env PYTHONPATH=/tmp/notorch python3 benchmarks/bench_certified.py serving --profile \
        --out "$OUT/serving.json"
      step bench_alloc 40 env PYTHONPATH=/tmp/notorch python3 benchmarks/bench_alloc.py --out "$OUT/alloc.json"
    fi
    q=$(( ${QUALITY_S:-545} - ($(date +%s) - t0) ))
    step quality $q python3 benchmarks/bench_certified.py quality --workload "${WORKLOAD:?}" --dir certificates \
      --shard "$(( ${QUALITY_FIRST:-0} + ${CUDA_VISIBLE_DEVICES:-0} ))/$of" --jobs $(( $(nproc) / (of < 2 ? 1 : 2) )) \
      --start "${!start_var:-0}" --stop-after "$(( q - ${PEER_S:-110} ))" \
      ${QUALITY_KERNELS:+--kernels "$QUALITY_KERNELS"} --out "$OUT/quality.json"
    ;;
  *) echo "SET must be first, second, core, families, matmul, matmul_tests, matmul_alone, mistral_attention, sq, moe, quality or cold" >&2
     exit 2 ;;
esac
