#!/usr/bin/env bash
# The pointwise library on this machine's GPU, measured the way benchmarks/README.md reports it, into an output
# directory:
#
#   bash benchmarks/gpu_pointwise.sh OUTDIR
#   STEPS=certify,certified KEYS=benchmarks/results/pointwise_keys_views.jsonl bash benchmarks/gpu_pointwise.sh OUT
#
# STEPS (default test,untuned,certify,certified; run in this order):
#   test      the half-precision paths checked on this GPU: each op with one served over every float16 and bfloat16
#             input (tests/kernels/test_pointwise_half.py), and float32 and float64 floor division served over
#             quotients at and beside integers and the special values (test_pointwise_floor_div.py); and the map
#             kernel's index paths and a copy's bits served (test_pointwise.py's view and copy tests); and the device
#             judge's verdicts against the host's (test_judge.py -m gpu); torch hidden;
#   probe     `probe_streaming.py` (not in the default steps): whether load and store cache hints move a DRAM-bound
#             kernel past torch's, into OUTDIR/probe.json and probe.txt;
#   untuned   `bench_pointwise.py --rounds 1` with each key's untuned config (NBXCERT_UNCERTIFIED=default), recording
#             the keys it forms (NBXCERT_KEY_RECORD) into OUTDIR/keys.jsonl;
#   certify   `nbxcert certify` of those keys (or of KEYS, a keys file) for PROFILE (default hopper) into certificates/,
#             stopped after CERTIFY_S seconds (default 300; a rerun resumes), the profile's pointwise certificates
#             then packed into OUTDIR/certificates.tar.gz;
#   certified `bench_pointwise.py` again (3 rounds), every key served from its certificate where it has one.
#
# Needs one NVIDIA GPU of the profile, and torch for the bench's peer (BENCH_ARGS adds arguments: --no-torch, --half
# bfloat16 for the bfloat16 cases).
# OUTDIR gets tests.txt, tests_views.txt, tests_judge.txt, half_errors.jsonl (each op's worst error over every 16-bit input: max_scaled <= 1 passes),
# untuned.json/.txt, keys.jsonl, certify.log, certified.json/.txt, served.jsonl (how each key of the certified run was
# served), certificates.tar.gz and summary.txt (the lines that matter), each from the steps run.
USAGE="[STEPS=test,probe,untuned,certify,certified] [KEYS=F] [PROFILE=hopper] [CERTIFY_S=S] [BENCH_ARGS=...] bash benchmarks/gpu_pointwise.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
PROFILE=${PROFILE:-hopper}
STEPS=",${STEPS:-test,untuned,certify,certified},"
source "$(dirname "$0")/gpu_env.sh"
: > "$dest/summary.txt"
if [[ $STEPS == *,test,* ]]; then
  # the ops served with their untuned config where no key is certified (the test judges values, not speed)
  rm -f "$dest/half_errors.jsonl"
  NBXCERT_UNCERTIFIED=default NBXCERT_HALF_REPORT="$dest/half_errors.jsonl" PYTHONPATH=/tmp/notorch python3 -m pytest \
    -q -p no:cacheprovider tests/kernels/test_pointwise_half.py tests/kernels/test_pointwise_floor_div.py -m gpu \
    > "$dest/tests.txt" 2>&1
  echo "half-precision paths, every 16-bit input: $(tail -1 "$dest/tests.txt")" | tee -a "$dest/summary.txt"
  # the map kernel's index paths (32-bit with Triton's division or a divider, 64-bit) and the copy's bits, served
  PYTHONPATH=/tmp/notorch python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pointwise.py \
    -k "layout or six_dims or three_operands or every_bit or across_dtypes" > "$dest/tests_views.txt" 2>&1
  echo "views and copies on the GPU: $(tail -1 "$dest/tests_views.txt")" | tee -a "$dest/summary.txt"
  # the device judge the certify step's checks use: the host's verdict for special values, exact results and views
  PYTHONPATH=/tmp/notorch python3 -m pytest -q -p no:cacheprovider tests/kernels/test_judge.py -m gpu \
    > "$dest/tests_judge.txt" 2>&1
  echo "the device judge on the GPU: $(tail -1 "$dest/tests_judge.txt")" | tee -a "$dest/summary.txt"
  python3 -c "import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; w = max(rows, key=lambda r: r['max_scaled']); print(f\"worst: {w['op']} {w['dtype']} at {w['max_scaled']:.3f} of the allowed error ({len(rows)} op-dtypes)\")" \
    "$dest/half_errors.jsonl" 2>&1 | tee -a "$dest/summary.txt"
fi
if [[ $STEPS == *,probe,* ]]; then
  python3 benchmarks/probe_streaming.py --out "$dest/probe.json" > "$dest/probe.txt" 2>&1
  echo "probe: exit $?, $(grep -c ' us ' "$dest/probe.txt") variants timed (probe.txt)" | tee -a "$dest/summary.txt"
fi
if [[ $STEPS == *,untuned,* ]]; then
  rm -f "$dest/keys.jsonl"
  NBXCERT_UNCERTIFIED=default NBXCERT_KEY_RECORD="$dest/keys.jsonl" python3 benchmarks/bench_pointwise.py \
    --out "$dest/untuned.json" --rounds 1 ${BENCH_ARGS:-} > "$dest/untuned.txt" 2>&1
  echo "untuned: $(tail -1 "$dest/untuned.txt")" | tee -a "$dest/summary.txt"
fi
if [[ $STEPS == *,certify,* ]]; then
  keys=${KEYS:-$dest/keys.jsonl}
  start=$(date +%s)
  PYTHONPATH=/tmp/notorch timeout -s INT "${CERTIFY_S:-300}" python3 -m nbxcert certify --profile "$PROFILE" \
    --keys "$keys" --out certificates --jobs "$JOBS" > "$dest/certify.log" 2>&1
  rc=$?
  echo "certify: $(wc -l < "$keys") keys, exit $rc, $(( $(date +%s) - start )) s: $(tail -1 "$dest/certify.log")" \
    | tee -a "$dest/summary.txt"
  tar czf "$dest/certificates.tar.gz" $(find certificates -path "*/$PROFILE/*" -name 'pw_*.json')
  echo "certificates: $(tar tzf "$dest/certificates.tar.gz" | wc -l) files in certificates.tar.gz" \
    | tee -a "$dest/summary.txt"
fi
if [[ $STEPS == *,certified,* ]]; then
  rm -f "$dest/served.jsonl"
  NBXCERT_UNCERTIFIED=default NBXCERT_KEY_RECORD="$dest/served.jsonl" python3 benchmarks/bench_pointwise.py \
    --out "$dest/certified.json" ${BENCH_ARGS:-} > "$dest/certified.txt" 2>&1
  echo "certified: $(tail -1 "$dest/certified.txt")" | tee -a "$dest/summary.txt"
  # how each key was served in that run (served: from a certificate; default: its untuned config, no certificate)
  python3 -c "import collections, json, sys; print(dict(collections.Counter(json.loads(l)['event'] for l in open(sys.argv[1]))))" \
    "$dest/served.jsonl" | sed 's/^/keys in the certified run: /' | tee -a "$dest/summary.txt"
  # a run that served no key from a certificate measured the untuned configs: said where it cannot be missed
  grep -q '"event": *"served"' "$dest/served.jsonl" || echo "certified: NO key was served from a certificate (the \
run measured every key's untuned config); the certificates this card would read: $(grep -m1 '^\[nbxcert\] certified:' \
"$dest/certified.txt")" | tee -a "$dest/summary.txt"
fi
