#!/usr/bin/env bash
# Verify certificates on this machine's NVIDIA GPUs, certified-only, logs into an output directory:
#
#   WORKLOADS="tinyllama-1.1b llama-3-8b" bash benchmarks/gpu_verify.sh OUTDIR
#
# `nbxcert verify --profile $PROFILE --workload W --dir certificates --certified-only` for each of WORKLOADS: every key
# launched through the serving path on fresh inputs and its output checked against the float64 oracle; a key with no
# certificate fails the run (never a sweep). Needs one or more NVIDIA GPUs of one host, of the certificates' profile
# (PROFILE, default hopper: H100 or H200). The keys are split into one `--shard i/N` per GPU (CUDA_VISIBLE_DEVICES=i)
# run at once, torch made unimportable in every process (gpu_env.sh).
#
# PER_GPU=2 runs two shards on each GPU at once, each with its share of the cores (a key's check is mostly host work:
# inputs and float64 oracles, so a GPU waits on one process's host). OF=8 FIRST=0 runs shards 0..3 of 8 (PER_GPU=2 on
# two GPUs) and a later run OF=8 FIRST=4 the rest (each shard's line names it; together they cover every key);
# SHARD_LIST="0 1 3" runs those shards of OF. KEYS="file ..." (with WORKLOADS=name, then only a label) verifies the
# keys of keys files instead of a workload's. SHARDS=1 GPU_BASE=1 runs on GPU 1 alone. VERIFY_S=S interrupts each
# shard after S seconds (its log says how far it got).
#
# OUTDIR gets verify_<W>.<i>.log (a line per key, then the shard's `[nbxcert] verify (shard i/N): ...` line), written
# as it runs, and verify_<W>.txt (the shards' summary lines and the wall time).
USAGE="[WORKLOADS=...] bash benchmarks/gpu_verify.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
PROFILE=${PROFILE:-hopper}
WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
PER_GPU=${PER_GPU:-1}
source "$(dirname "$0")/gpu_env.sh"
GPUS=$SHARDS
RUNS=$(( GPUS * PER_GPU ))
JOBS=$(( $(nproc) / RUNS )); [ "$JOBS" -ge 1 ] || JOBS=1
OF=${OF:-$RUNS}
FIRST=${FIRST:-0}
[ -z "${KEYS:-}" ] || cat $KEYS > "$dest/verify-keys.jsonl"  # KEYS="file ...": their keys, as one file
for w in $WORKLOADS; do
  start=$(date +%s)
  j=0
  for i in ${SHARD_LIST:-$(seq "$FIRST" $(( FIRST + RUNS - 1 )))}; do
    gpu=$(( ${GPU_BASE:-0} + j % GPUS )); j=$(( j + 1 ))
    CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
      PYTHONPATH=/tmp/notorch timeout -s INT "${VERIFY_S:-0}" python3 -m nbxcert verify --profile "$PROFILE" \
      $(if [ -n "${KEYS:-}" ]; then echo --keys "$dest/verify-keys.jsonl"; else echo --workload "$w"; fi) \
      --dir certificates --certified-only --shard "$i/$OF" --jobs "$JOBS" \
      > "$dest/verify_$w.$i.log" 2>&1 &
  done
  wait
  { for i in ${SHARD_LIST:-$(seq "$FIRST" $(( FIRST + RUNS - 1 )))}; do
      grep -hE "^\[nbxcert\] verify( \(shard [0-9/]+\))?: |^missing|^mismatched" "$dest/verify_$w.$i.log"
    done
    echo "verify of $w: $(( $(date +%s) - start )) s"; } | tee "$dest/verify_$w.txt"
done
