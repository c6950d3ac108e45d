#!/usr/bin/env bash
# The long fuzz run of the command line (tests/cli/test_fuzz.py, -m fuzz) spread over processes: each command's fuzz
# test in SHARDS shards of EXAMPLES/SHARDS cases, each shard under its own Hypothesis seed (1..SHARDS), JOBS shards
# at a time, the slowest commands first. Writes OUTDIR/<test>-<seed>.jsonl (the test's case count and seconds),
# OUTDIR/<test>-<seed>.log (pytest's output) and OUTDIR/summary.txt (one line per shard: passed, FAILED, or with
# FUZZ_SECONDS set, a time for the whole run, "timed out" / "not started" for a shard that did not finish in it).
# FUZZ_COMMANDS="keys index_check ..." runs only those commands (the test names' stems), in that order.
# FUZZ_AFTER=SUMMARY runs only the shards that SUMMARY (a cut run's summary.txt, same EXAMPLES and SHARDS) did not
# record as passed.
#
#   bash tests/run_fuzz.sh OUTDIR [EXAMPLES=10000] [SHARDS=4] [JOBS=cores]
set -euo pipefail
outdir=${1:?usage: tests/run_fuzz.sh OUTDIR [EXAMPLES] [SHARDS] [JOBS]}
examples=${2:-10000}
shards=${3:-4}
jobs=${4:-$(nproc)}
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
per=$(( (examples + shards - 1) / shards ))
# slowest first (seconds per 800 cases in tests/FUZZ.md), then the rest in collection order
first="validate stale merge diff index_build census verify kernels certify"
all=$(NBXCERT_BACKEND=interpreter "$python" -m pytest tests/cli/test_fuzz.py -m fuzz -k test_cli_ --collect-only -q \
  -p no:cacheprovider 2>/dev/null | sed -n 's/^tests\/cli\/test_fuzz.py::test_cli_\(.*\)_fuzz$/\1/p')
order=$( (for c in $first; do echo "$all" | grep -qx "$c" && echo "$c"; done; echo "$all") | awk '!seen[$0]++')
if [ -n "${FUZZ_COMMANDS:-}" ]; then order=$FUZZ_COMMANDS; fi  # only these commands (test stems), in this order
for c in $order; do for s in $(seq 1 "$shards"); do echo "$c $s"; done; done > "$outdir/shards.txt"
if [ -n "${FUZZ_AFTER:-}" ]; then  # the summary of a cut run: only its shards that did not pass run here
  grep -vxFf <(awk '$3 == "passed" {print $1, $2}' "$FUZZ_AFTER") "$outdir/shards.txt" > "$outdir/shards.left" || true
  mv "$outdir/shards.left" "$outdir/shards.txt"
fi
deadline=$(( $(date +%s) + ${FUZZ_SECONDS:-1000000000} ))
export outdir per python deadline
run_shard() {
  local name=$1 seed=$2 base="$outdir/test_cli_$1_fuzz-$2" left rc=0
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -le 0 ]; then echo "$name $seed not started" >> "$outdir/summary.txt"; return 0; fi
  timeout "$left" env NBXCERT_BACKEND=interpreter NBXCERT_FUZZ_EXAMPLES=$per NBXCERT_FUZZ_REPORT="$base.jsonl" \
      "$python" -m pytest "tests/cli/test_fuzz.py::test_cli_${name}_fuzz" -m fuzz -q -p no:cacheprovider \
      --hypothesis-seed="$seed" > "$base.log" 2>&1 || rc=$?
  case $rc in
    0) echo "$name $seed passed" >> "$outdir/summary.txt" ;;
    124) echo "$name $seed timed out" >> "$outdir/summary.txt" ;;
    *) echo "$name $seed FAILED" >> "$outdir/summary.txt" ;;
  esac
}
export -f run_shard
xargs -P "$jobs" -L 1 bash -c 'run_shard "$0" "$1"' < "$outdir/shards.txt"
echo "$(grep -c passed "$outdir/summary.txt" || true) shards passed, $(grep -c FAILED "$outdir/summary.txt" || true) failed"
