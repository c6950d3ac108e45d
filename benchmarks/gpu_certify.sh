#!/usr/bin/env bash
# One device call of the Hopper certification (issues #6/#8): install from the working tree, then
# `nbxcert certify --profile hopper` over the keys of $WORKLOADS into certificates/nvidia/hopper, for at most
# $CERTIFY_S seconds (resumable: a later call continues where this one stopped), with torch made unimportable in every
# process (a sitecustomize whose meta_path finder refuses it).
# KEYS="file ..." certifies the keys of keys files instead (JSON lines, as `nbxcert keys --json` writes them); a key certified
# by another nbxcert version or card is swept again, one certified by this one is skipped (resumable).
# With several GPUs the keys are split into one `--shard i/N` per GPU (CUDA_VISIBLE_DEVICES=i), run at once, each
# with its share of the CPU cores for compiling; they write into the same directory (writes are atomic and locked).
# Logs (one line per key, and each shard's JSON summary when it finishes) and the certificates come back packed in
# $OUT/hopper_certs.tgz; $OUT/coverage_*.txt says what is covered; the Triton cache comes back in parts
# ($OUT/triton_cache.tgz.*: copy them into .triton-carry/ and name it in the next call's `carry`).
set -u
WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
CERTIFY_S=${CERTIFY_S:-300}
mkdir -p /tmp/certify-logs
source "$(dirname "$0")/gpu_env.sh"
: > /tmp/certify-logs/keys.jsonl
if [ -n "${KEYS:-}" ]; then  # keys files instead (e.g. benchmarks/stale_hopper_0.1.0.jsonl: keys to sweep again)
  cat $KEYS > /tmp/certify-logs/keys.jsonl
else
  for w in $WORKLOADS; do
    python3 -m nbxcert keys --profile hopper --workload "$w" --json >> /tmp/certify-logs/keys.jsonl
  done
fi
echo "$(wc -l < /tmp/certify-logs/keys.jsonl) keys of ${KEYS:-$WORKLOADS} over $SHARDS shard(s), $JOBS compile jobs each"
mkdir -p certificates/nvidia/hopper
start=$(date +%s)
for i in $(seq 0 $(( SHARDS - 1 ))); do
  # each shard's float64 oracles (numpy's BLAS) get its share of the cores, not all of them each
  CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
  PYTHONPATH=/tmp/notorch timeout -s INT "$CERTIFY_S" python3 -m nbxcert certify \
    --profile hopper --keys /tmp/certify-logs/keys.jsonl --out certificates --shard "$i/$SHARDS" --jobs "$JOBS" \
    > "/tmp/certify-logs/shard$i.log" 2>&1 &
done
wait
echo "certify: $SHARDS shard(s) ended after $(( $(date +%s) - start )) s"
for w in $WORKLOADS; do
  PYTHONPATH=/tmp/notorch python3 -m nbxcert coverage --profile hopper --workload "$w" --dir certificates \
    2>&1 | tail -1 | tee "$OUT/coverage_$w.txt"
done
rm -f certificates/nvidia/hopper/.lock
tar czf "$OUT/hopper_certs.tgz" certificates/nvidia/hopper /tmp/certify-logs 2>/dev/null
[ "${PACK_CACHE:-1}" = 1 ] && triton_cache_pack 3  # the next call carries it (.triton-carry) and compiles less
