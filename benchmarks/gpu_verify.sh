#!/usr/bin/env bash
# One device call of issue #8's check: `nbxcert verify --profile hopper --workload W --certified-only` for each of
# $WORKLOADS, split into one `--shard i/N` per GPU (CUDA_VISIBLE_DEVICES=i) run at once, torch made unimportable in
# every process, each for at most $VERIFY_S seconds (then interrupted: its log says how far it got). Each shard's log
# (a line per key, then its `[nbxcert] verify (shard i/N): ...` line) is written under $OUT as it runs, so it comes
# back even when the call itself is cut short; $OUT/verify_W.txt holds the summary lines and the wall time.
# PER_GPU=2 runs two shards on each GPU at once, each with its share of the cores (a key's check is mostly host work:
# inputs and float64 oracles, so a GPU waits on one process's host). A workload too long for one call is split into
# more shards than run at once: OF=8 FIRST=0 runs shards 0..3 of 8 (PER_GPU=2 on two GPUs), a later call OF=8 FIRST=4
# the rest (each shard's line names it; together they cover every key). SHARD_LIST="0 1 3" runs those shards of OF.
# KEYS="file ..." (with WORKLOADS=name, then only a label) verifies the keys of keys files instead of a workload's.
# SHARDS=1 GPU_BASE=1 runs on GPU 1 alone (while GPU 0 does other work in the same call).
set -u
WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
VERIFY_S=${VERIFY_S:-540}
PER_GPU=${PER_GPU:-1}
source "$(dirname "$0")/gpu_env.sh"
GPUS=$SHARDS
RUNS=$(( GPUS * PER_GPU ))
JOBS=$(( $(nproc) / RUNS )); [ "$JOBS" -ge 1 ] || JOBS=1
OF=${OF:-$RUNS}
FIRST=${FIRST:-0}
[ -z "${KEYS:-}" ] || cat $KEYS > /tmp/verify-keys.jsonl  # KEYS="file ...": their keys, as one file
for w in $WORKLOADS; do
  start=$(date +%s)
  j=0
  for i in ${SHARD_LIST:-$(seq "$FIRST" $(( FIRST + RUNS - 1 )))}; do
    gpu=$(( ${GPU_BASE:-0} + j % GPUS )); j=$(( j + 1 ))
    CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
      PYTHONPATH=/tmp/notorch timeout -s INT "$VERIFY_S" python3 -m nbxcert verify --profile hopper \
      $(if [ -n "${KEYS:-}" ]; then echo --keys /tmp/verify-keys.jsonl; else echo --workload "$w"; fi) \
      --dir certificates --certified-only --shard "$i/$OF" --jobs "$JOBS" \
      > "$OUT/verify_$w.$i.log" 2>&1 &
  done
  wait
  { for i in ${SHARD_LIST:-$(seq "$FIRST" $(( FIRST + RUNS - 1 )))}; do
      grep -hE "^\[nbxcert\] verify( \(shard [0-9/]+\))?: |^missing|^mismatched" "$OUT/verify_$w.$i.log"
    done
    echo "verify of $w: $(( $(date +%s) - start )) s"; } | tee "$OUT/verify_$w.txt"
  # a call returns at most 8 files: a finished workload's logs go back as one archive
  tar czf "$OUT/verify_$w.logs.tgz" -C "$OUT" $(cd "$OUT" && ls verify_"$w".*.log) && rm -f "$OUT"/verify_"$w".*.log
done
