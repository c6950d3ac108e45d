#!/usr/bin/env bash
# Two sets of benchmarks/gpu_check.sh at once on a machine of two NVIDIA GPUs: SET_A on GPU 0 into OUTDIR/gpu0 and
# SET_B on GPU 1 into OUTDIR/gpu1, their summaries joined in OUTDIR/summary.txt:
#
#   bash benchmarks/gpu_pair.sh SET_A SET_B OUTDIR
#   QUALITY_OF=2 WORKLOAD=llama-3-8b bash benchmarks/gpu_pair.sh quality quality OUTDIR   # one shard per GPU
#
# Needs two NVIDIA GPUs of one host, of the profile gpu_check.sh names. The GPUs are separate, so no kernel shares a
# GPU with the other set; the host's CPU cores are shared, which slows the host side of what either set times
# (benchmarks/README.md names the machine and its load beside each figure). PAIR_S=S interrupts each set after S
# seconds (SIGINT: its steps so far are kept).
set -u
if [ -z "${1:-}" ] || [ -z "${2:-}" ] || [ -z "${3:-}" ]; then
  echo "usage: bash benchmarks/gpu_pair.sh SET_A SET_B OUTDIR" >&2
  exit 2
fi
SET_A=$1 SET_B=$2
mkdir -p "$3/gpu0" "$3/gpu1" && dest=$(cd "$3" && pwd)
source "$(dirname "$0")/gpu_env.sh"
here=$(dirname "$0")
(CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 15 "${PAIR_S:-0}" bash "$here/gpu_check.sh" "$SET_A" "$dest/gpu0" \
  > "$dest/gpu0.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout -s INT -k 15 "${PAIR_S:-0}" bash "$here/gpu_check.sh" "$SET_B" "$dest/gpu1" \
  > "$dest/gpu1.log" 2>&1) &
wait
for g in 0 1; do echo "== GPU $g"; cat "$dest/gpu$g/summary.txt"; done | tee "$dest/summary.txt"
