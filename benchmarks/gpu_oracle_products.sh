#!/usr/bin/env bash
# The oracles' float64 products on the host (numpy) against the GPU's (cuBLAS DGEMM, NBXCERT_ORACLE_PRODUCTS=device),
# timed where they weigh most: `nbxcert certify --force` of the same keys into a fresh directory once each way, the
# keys' lines (their `in the runners, inputs and oracle` part) in an output directory:
#
#   bash benchmarks/gpu_oracle_products.sh OUTDIR
#   KEYS="key text ..." bash benchmarks/gpu_oracle_products.sh OUTDIR
#
# Default keys: qwen2.5-7b's float16 prefill gate/up product at 4096 tokens (its float64 pair is 2.2 TFLOP), an LM-head
# key at 64 tokens (a 152064 x 3584 weight for a small product) and a down projection at 512 tokens. Needs one NVIDIA
# GPU of the profile (PROFILE, default hopper) and libcublas (`nbxcert doctor` names it under `oracle products`).
#
# OUTDIR gets products_test.txt (tests/kernels/test_products.py on this GPU), host.log and device.log (each run's
# certify lines), summary.txt (one line per key and side: the key's seconds and the runner's inputs and oracle).
USAGE="[KEYS=...] bash benchmarks/gpu_oracle_products.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
PROFILE=${PROFILE:-hopper}
source "$(dirname "$0")/gpu_env.sh"
KEYS=${KEYS:-"matmul[K=3584,M=4096,N=37888,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1
matmul[K=3584,M=64,N=152064,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1
matmul[K=18944,M=512,N=3584,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1"}
PYTHONPATH=/tmp/notorch python3 -m pytest -q -p no:cacheprovider tests/kernels/test_products.py \
  > "$dest/products_test.txt" 2>&1
asked=()
while read -r key; do [ -n "$key" ] && asked+=(--key "$key"); done <<< "$KEYS"
: > "$dest/summary.txt"
for side in host device; do
  work=$(mktemp -d)
  NBXCERT_ORACLE_PRODUCTS=$side PYTHONPATH=/tmp/notorch python3 -m nbxcert certify --profile "$PROFILE" \
    "${asked[@]}" --out "$work" --force --jobs "$JOBS" > "$dest/$side.log" 2>&1
  grep -E '^\[nbxcert\] [0-9]+/[0-9]+ (certified|failed)' "$dest/$side.log" \
    | sed -E "s/^\[nbxcert\] [0-9]+\/[0-9]+ /$side: /; s/\): .*/)/" >> "$dest/summary.txt"
  rm -rf "$work"
done
cat "$dest/summary.txt"
