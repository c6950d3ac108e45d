#!/usr/bin/env bash
# Certification throughput on this machine's GPU, measured the way benchmarks/README.md reports it, into an output
# directory:
#
#   WORKLOAD=llama-3-8b CERTIFY_S=300 bash benchmarks/gpu_throughput.sh OUTDIR
#
# 1. the sweep's timing replay, the inputs' device draws and the attention, fused MoE and quantized references on the
#    device checked on this GPU (their tests; torch hidden);
# 2. `profile_sweep.py` over three keys of WORKLOAD (PROFILE_KEYS: their texts, one a line; default a decode matmul,
#    an LM-head matmul and a decode attention key of llama-3-8b), with --compare 4: each phase's seconds, and screens
#    replayed against dispatched, and every candidate screened again as one queue of 8 repetitions each
#    (`--batched-screens`: its wall, medians and finalists beside the sweep's screens), and the candidates' kernels
#    loaded apart from their first launches, half of them on 8 threads (`--load-threads`); about a minute with the rest;
#    NO_PROFILE=1 skips the step); before it, `probe_pool_start.py` on the first of those keys (a cold pool of compile
#    workers against warm ones and a lone one, in a Triton cache of its own; NO_PROBE=1 skips it);
# 3. `gpu_certify.sh` of WORKLOAD into certificates/nvidia/$PROFILE, stopped after CERTIFY_S seconds (default 300;
#    a rerun resumes; CERT_DIR=D certifies into D instead, AHEAD=N keeps N keys' compiles ahead), then
#    `bench_certified.py throughput` of its log: keys a minute and each part's share.
#
# Needs one NVIDIA GPU of the profile (PROFILE, default hopper). OUTDIR gets tests.txt, probe_pool_start_{device,cross}.json,
# profile/ (summary.json and a report per key), certify/ (gpu_certify.sh's files) and throughput.json; summary.txt has
# the lines that matter.
USAGE="[WORKLOAD=...] [CERTIFY_S=S] [PROFILE_KEYS=...] [NO_PROBE=1] [NO_PROFILE=1] [CERT_DIR=D] [AHEAD=N] bash benchmarks/gpu_throughput.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
PROFILE=${PROFILE:-hopper}
WORKLOAD=${WORKLOAD:-llama-3-8b}
source "$(dirname "$0")/gpu_env.sh"
PROFILE_KEYS=${PROFILE_KEYS:-"matmul[K=4096,M=1,N=28672,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1
matmul[K=4096,M=64,N=128256,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1
decode_attention[batch=32,head_dim=128,heads=32,kv_heads=8,kv_len=4096;float16]@v1"}
: > "$dest/summary.txt"
ON_GPU="timed_launch_replays or not_replayed or device_draw or draws_a_large or compile_only or device_reference"
# fused MoE's and the quantized products' references on the device, and the device's dequantized weight to the bit
ON_GPU="$ON_GPU or gpu_oracle_on_the_device or weight_dequantized_on_the_device"
# the cross-compiling pool's kernels found by the runner in Triton's cache (NBXCERT_COMPILE_POOL=cross)
ON_GPU="$ON_GPU or runner_finds_every_kernel_the_cross_pool_compiled"
PYTHONPATH=/tmp/notorch python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_launch.py tests/kernels/test_inputs.py tests/kernels/test_attention64.py \
  tests/kernels/test_moe.py tests/kernels/test_quant.py tests/engine/test_crosspool.py -k "$ON_GPU" \
  > "$dest/tests.txt" 2>&1
echo "tests: $(tail -1 "$dest/tests.txt")" | tee -a "$dest/summary.txt"
if [ "${NO_PROBE:-0}" != 1 ]; then
  # a cold compile pool's first compiles against warm workers and a lone one (the first profiled key's candidates),
  # in a Triton cache of its own so the run below starts as cold as it was asked to
  # both kinds of pool (NBXCERT_COMPILE_POOL): workers compiling on the GPU, and cross-compiling for it
  for pool in device cross; do
    PYTHONPATH=/tmp/notorch TRITON_CACHE_DIR=$(mktemp -d) python3 benchmarks/probe_pool_start.py --pool "$pool" \
      --key "$(head -1 <<< "$PROFILE_KEYS")" --out "$dest/probe_pool_start_$pool.json" \
      > "$dest/probe_pool_start_$pool.txt" 2>&1
    tail -1 "$dest/probe_pool_start_$pool.txt" | tee -a "$dest/summary.txt"
  done
fi
if [ "${NO_PROFILE:-0}" != 1 ]; then
  asked=()
  while read -r key; do [ -n "$key" ] && asked+=(--key "$key"); done <<< "$PROFILE_KEYS"
  PYTHONPATH=/tmp/notorch python3 benchmarks/profile_sweep.py "${asked[@]}" --out "$dest/profile" --compare 4 \
    --batched-screens 8 --load-threads 8 \
    > "$dest/profile.txt" 2>&1
  # each key's phases, loads and batched screens (the rows' first 400 characters held only the replay comparison)
  python3 benchmarks/profile_sweep.py --summarize "$dest/profile/summary.json" 2>&1 | tee -a "$dest/summary.txt"
fi
WORKLOADS=$WORKLOAD CERTIFY_S=${CERTIFY_S:-300} bash "$(dirname "$0")/gpu_certify.sh" "$dest/certify" \
  > "$dest/certify.txt" 2>&1
python3 benchmarks/bench_certified.py throughput "$dest/certify/certify_shard0.log" > "$dest/throughput.json" 2>&1
grep -E '"keys_certified"|"keys_per_minute"|"shares"' -A7 "$dest/throughput.json" | head -12 \
  | tee -a "$dest/summary.txt"
