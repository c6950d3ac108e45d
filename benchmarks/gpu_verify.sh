#!/usr/bin/env bash
# One device call of issue #8's check: `nbxcert verify --profile hopper --workload W --certified-only` for each of
# $WORKLOADS, split into one `--shard i/N` per GPU (CUDA_VISIBLE_DEVICES=i) run at once, torch made unimportable in
# every process, each for at most $VERIFY_S seconds (then interrupted: its log says how far it got). Each shard's log
# (a line per key, then its `[nbxcert] verify (shard i/N): ...` line) is written under $OUT as it runs, so it comes
# back even when the call itself is cut short; $OUT/verify_W.txt holds the summary lines and the wall time.
set -u
WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
VERIFY_S=${VERIFY_S:-540}
source "$(dirname "$0")/gpu_env.sh"
for w in $WORKLOADS; do
  start=$(date +%s)
  for i in $(seq 0 $(( SHARDS - 1 ))); do
    CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
      PYTHONPATH=/tmp/notorch timeout -s INT "$VERIFY_S" python3 -m nbxcert verify --profile hopper \
      --workload "$w" --dir certificates --certified-only --shard "$i/$SHARDS" --jobs "$JOBS" \
      > "$OUT/verify_$w.$i.log" 2>&1 &
  done
  wait
  { for i in $(seq 0 $(( SHARDS - 1 ))); do
      grep -hE "^\[nbxcert\] verify( \(shard [0-9/]+\))?: |^missing|^mismatched" "$OUT/verify_$w.$i.log"
    done
    echo "verify of $w: $(( $(date +%s) - start )) s"; } | tee "$OUT/verify_$w.txt"
done
