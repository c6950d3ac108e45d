#!/usr/bin/env bash
# A workload's launch sequence swept at run time, measured whole in parts, into an output directory:
#
#   WORKLOAD=llama-3-8b BUDGET_S=540 bash benchmarks/gpu_sweep_parts.sh OUTDIR
#
# The run-time sweep of a 7-8B model's first launches outlasts one run of a few minutes, so the sequence is measured
# in parts: each part a fresh process (`bench_certified.py coldstart --runs swept`) that starts at the launch the last
# part ended before (--from-launch) and starts no launch after its time (--stop-after), with the Triton and nbxcert
# caches the whole run's one process would keep (--cache-dir, under STATE). Run again, on the same machine, it goes on
# where it stopped; it does nothing once the sequence is done. The whole is the parts' times to their last launch
# summed; each part pays one more process start than the whole run would.
#
# WORKLOAD (default llama-3-8b), BUDGET_S (default 540: this invocation starts no part after it), MARGIN_S (default
# 120: a part starts no launch this close to the budget's end), SWEEP_JOBS (default the CPU count: NBXCERT_SWEEP_JOBS,
# the candidates compiled in that many workers first), STATE (default /tmp/nbx-sweep-parts: the caches and parts).
# Torch is hidden in every process (PYTHONPATH=/tmp/notorch), as in an nbxcert application.
# OUTDIR gets parts.jsonl (every part so far, one JSON line each), summary.txt and state.tar.gz: the parts, where the
# next starts and nbxcert's run-time cache (the winners swept so far), not Triton's cache.
#
# On another machine with a card of the same memory class (the run-time cache is kept per class), RESUME=state.tar.gz
# goes on from that state. Triton's cache is not in it (every candidate compiled so far: too large to carry), so a
# later launch of a key swept on the other machine finds its winner in the run-time cache but compiles it, where the
# whole run's one process had it: those launches are counted apart (`carried_hits` of a part) and the summary gives
# the whole with and without their seconds.
USAGE="[WORKLOAD=llama-3-8b] [BUDGET_S=540] [MARGIN_S=120] [SWEEP_JOBS=N] [STATE=DIR] [RESUME=state.tar.gz] bash benchmarks/gpu_sweep_parts.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
source "$(dirname "$0")/gpu_env.sh"
WORKLOAD=${WORKLOAD:-llama-3-8b}
BUDGET_S=${BUDGET_S:-540}
MARGIN_S=${MARGIN_S:-120}
SWEEP_JOBS=${SWEEP_JOBS:-$(nproc)}
STATE=${STATE:-/tmp/nbx-sweep-parts}
mkdir -p "$STATE/cache"
if [ -n "${RESUME:-}" ] && [ ! -e "$STATE/next" ]; then
  tar xzf "$RESUME" -C "$STATE" || { echo "gpu_sweep_parts.sh: cannot unpack RESUME=$RESUME" >&2; exit 2; }
  echo "resumed from $RESUME at launch $(cat "$STATE/next")"
fi
start=$(date +%s)
total=$(PYTHONPATH=/tmp/notorch:benchmarks python3 -c "import sys
import bench_certified
from nbxcert.workload import launches, load_workload
print(sum(1 for _ in launches(load_workload(sys.argv[1]), bench_certified._device()[1])))" "$WORKLOAD") || exit 1
while :; do
  next=$(cat "$STATE/next" 2>/dev/null || echo 0)
  [ "$next" -ge "$total" ] && break
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  [ "$left" -gt "$MARGIN_S" ] || break
  k=$(find "$STATE" -maxdepth 1 -name 'part-*.json' | wc -l)
  PYTHONPATH=/tmp/notorch python3 benchmarks/bench_certified.py coldstart --workload "$WORKLOAD" --runs swept \
    --cache-dir "$STATE/cache" --from-launch "$next" --stop-after $(( left - MARGIN_S )) --sweep-limit "$left" \
    --sweep-jobs "$SWEEP_JOBS" --out "$STATE/part-$k.json" > "$STATE/part-$k.log" 2>&1
  # the next part starts where this one ended: after its last launch (a part cut at its hard limit mid-launch is
  # marked "cut"; its unfinished launch is swept again by the next part, its compiles already in the cache)
  python3 - "$STATE" "$k" "$next" <<'PY' || break
import json, sys
state, k, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
run = json.load(open(f"{state}/part-{k}.json"))["runtime_sweep"]
if "error" in run:
    print(f"part {k} failed: {run['error']}", file=sys.stderr)
    sys.exit(1)
if run.get("cut_at_limit"):
    done, last = run["reached"]["launches"], run["reached"].get("elapsed_s", 0.0)
else:
    done, last = run["launches"], (run["elapsed"] or [0.0])[-1]
hits = run.get("carried_hits") or []
part = {"part": k, "from_launch": first, "launches": done, "to_last_launch_s": last, "wall_s": run["wall_s"],
        "cut": bool(run.get("cut_at_limit")), "inputs_s": run.get("inputs_s"), "carried_hits": len(hits),
        "carried_hits_s": round(sum(h[1] for h in hits), 4)}
with open(f"{state}/parts.jsonl", "a") as f:
    f.write(json.dumps(part) + "\n")
open(f"{state}/next", "w").write(str(first + done))
print(json.dumps(part))
sys.exit(0 if done or not part["cut"] else 1)  # a part that finished no launch would loop for ever
PY
done
cp "$STATE/parts.jsonl" "$dest/parts.jsonl" 2>/dev/null
(cd "$STATE" && tar czf "$dest/state.tar.gz" $(ls parts.jsonl next part-*.json 2>/dev/null) cache/nbxcert/runtime 2>/dev/null)
python3 - "$STATE/parts.jsonl" "$total" "$WORKLOAD" <<'PY' | tee "$dest/summary.txt"
import json, sys
parts = [json.loads(line) for line in open(sys.argv[1])] if len(sys.argv) > 1 else []
total, workload = int(sys.argv[2]), sys.argv[3]
done = sum(p["launches"] for p in parts)
whole = sum(p["to_last_launch_s"] for p in parts)
carried = sum(p.get("carried_hits_s", 0.0) for p in parts)
state = "whole" if done >= total else f"not done: {total - done} launches left"
print(f"{workload}: run-time sweep of {done} of {total} launches in {len(parts)} parts, {whole:.1f} s to the last "
      f"launch summed ({state}); parts cut at their limit: {sum(p['cut'] for p in parts)}; "
      f"{sum(p.get('carried_hits', 0) for p in parts)} launches of keys swept in an earlier part took {carried:.1f} s "
      f"(without them: {whole - carried:.1f} s, a lower bound of the whole)")
PY
