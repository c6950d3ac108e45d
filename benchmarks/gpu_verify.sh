#!/usr/bin/env bash
# One device call of issue #8's check: `nbxcert verify --profile hopper --workload W --certified-only` for each of
# $WORKLOADS, split into one `--shard i/N` per GPU (CUDA_VISIBLE_DEVICES=i) run at once, torch made unimportable in
# every process. Each shard prints its `[nbxcert] verify (shard i/N): ...` line; $OUT/verify_W.txt holds them all.
set -u
WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
mkdir -p /tmp/verify-logs
source "$(dirname "$0")/gpu_env.sh"
for w in $WORKLOADS; do
  start=$(date +%s)
  for i in $(seq 0 $(( SHARDS - 1 ))); do
    CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
      PYTHONPATH=/tmp/notorch python3 -m nbxcert verify --profile hopper --workload "$w" \
      --dir certificates --certified-only --shard "$i/$SHARDS" --jobs "$JOBS" > "/tmp/verify-logs/$w.$i.log" 2>&1 &
  done
  wait
  { for i in $(seq 0 $(( SHARDS - 1 ))); do grep -hE "^\[nbxcert\] verify( \(shard [0-9/]+\))?: |^missing|^mismatched" "/tmp/verify-logs/$w.$i.log"; done
    echo "verify of $w: $(( $(date +%s) - start )) s"; } | tee "$OUT/verify_$w.txt"
done
tar czf "$OUT/verify_logs.tgz" /tmp/verify-logs 2>/dev/null
