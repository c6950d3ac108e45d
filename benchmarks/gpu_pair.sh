#!/usr/bin/env bash
# One device call on a machine of two GPUs: two sets of benchmarks/gpu_check.sh at once, $SET_A on GPU 0 and $SET_B
# on GPU 1, each for at most $PAIR_S seconds, their outputs packed into $OUT/checks.tgz (a call returns at most 8 files).
# The GPUs are separate, so no kernel shares a GPU with the other set; the host's CPU cores are shared (what that may
# cost a timing is noted beside each figure in RESULTS.md).
#   SET_A=next SET_B=next2 bash benchmarks/gpu_pair.sh
set -u
source "$(dirname "$0")/gpu_env.sh"
PAIR_S=${PAIR_S:-560}
FINAL=$OUT
mkdir -p /tmp/pair/a /tmp/pair/b
(CUDA_VISIBLE_DEVICES=0 SET=$SET_A OUT=/tmp/pair/a timeout -s INT -k 15 "$PAIR_S" bash "$(dirname "$0")/gpu_check.sh" \
  > /tmp/pair/a.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 SET=$SET_B OUT=/tmp/pair/b timeout -s INT -k 15 "$PAIR_S" bash "$(dirname "$0")/gpu_check.sh" \
  > /tmp/pair/b.log 2>&1) &
wait
for s in a b; do echo "== GPU $s"; cat /tmp/pair/$s/summary.txt; done | tee "$FINAL/summary.txt"
tar czf "$FINAL/checks.tgz" -C /tmp pair
