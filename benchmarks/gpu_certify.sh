#!/usr/bin/env bash
# Certify shipped workloads on this machine's NVIDIA GPUs into certificates/nvidia/$PROFILE, logs into an output
# directory:
#
#   WORKLOADS="tinyllama-1.1b llama-3-8b" bash benchmarks/gpu_certify.sh OUTDIR
#   WORKLOADS=shipped bash benchmarks/gpu_certify.sh OUTDIR   # every workload of the coverage gate (coverage.txt)
#   KEYS=stale.jsonl FORCE=1 bash benchmarks/gpu_certify.sh OUTDIR     # keys files instead (`nbxcert stale --out`)
#
# Needs one or more NVIDIA GPUs of one host, of the profile to certify (PROFILE, default hopper: H100 or H200; the
# shipped nvidia/hopper certificates were made on H200s). With several GPUs the keys are split into one `--shard i/N`
# per GPU (CUDA_VISIBLE_DEVICES=i), run at once, each with its share of the CPU cores for compiling and for the float64
# oracles; they write into the same directory (writes are atomic and locked). torch is made unimportable in every
# process (gpu_env.sh).
#
# Resumable: a key already certified on this card, driver and Triton with the same code is skipped, so the same command
# goes on where a stopped one ended. KEYS="file ..." certifies the keys of keys files (JSON lines, as `nbxcert keys
# --json` and `nbxcert stale --out` write them) instead of the workloads'; FORCE=1 sweeps keys again even where they
# are certified (`certify --force`), as stale winners need. CERTIFY_S=S interrupts each shard after S seconds (every
# entry written so far is kept). CERT_DIR=D certifies into D instead of certificates/ (a measurement that is not to
# be shipped; a key keeps one entry a memory class, so a card of another class than the shipped entries' adds its
# own beside them). AHEAD=N keeps N keys' compiles queued ahead of the key on the GPU (`certify --ahead`, default 16).
#
# The keys this card's memory class lacks are certified first, then those certified by code that has changed since,
# then the rest (ORDER=given keeps the order asked for).
#
# OUTDIR gets keys.jsonl (the keys asked for, in the order certified), coverage_before.json (their coverage for this
# card's class before the run), certify_shard<i>.log (a line per key as it finishes, then the table), throughput.json
# (`bench_certified.py throughput` of those logs: keys a minute, shares, each kernel's time),
# coverage_<workload>.txt (`nbxcert coverage`'s line for this card's memory class) for each of WORKLOADS (with
# KEYS, those named), written.txt (the certificate files the run wrote) and written.tar.gz (those files; in parts
# written.tar.gz.part-aa, -ab, ... where it is over PACK_MB MB, default 15).
USAGE="[WORKLOADS=...] [KEYS=...] [CERT_DIR=D] [AHEAD=N] [ORDER=given] [PACK_MB=15] bash benchmarks/gpu_certify.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
PROFILE=${PROFILE:-hopper}
[ -n "${KEYS:-}" ] || WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
WORKLOADS=${WORKLOADS:-}
CERT_DIR=${CERT_DIR:-certificates}
if [ "$WORKLOADS" = shipped ]; then  # every workload the profile's coverage gate names, in its order
  WORKLOADS=$(grep -v '^#' "certificates/nvidia/$PROFILE/coverage.txt" | awk 'NF && !seen[$1]++ {print $1}' | xargs)
fi
source "$(dirname "$0")/gpu_env.sh"
: > "$dest/keys.jsonl"
if [ -n "${KEYS:-}" ]; then
  cat $KEYS > "$dest/keys.jsonl"
else
  for w in $WORKLOADS; do
    python3 -m nbxcert keys --profile "$PROFILE" --workload "$w" --json >> "$dest/keys.jsonl"
  done
fi
# this card's memory class: the coverage a card of it is served (a key's entries of other classes are not)
CLASS=$(PYTHONPATH=/tmp/notorch python3 -c "
from nbxcert.kernels.backends import cuda
from nbxcert.memory_class import memory_class
from nbxcert.profiles import get_profile
info = cuda.device_info(0)
print(memory_class(get_profile('$PROFILE'), info.total_memory, info.attributes.get('multiprocessor_count')))")
# the keys this card's class lacks first, then those certified by code that has changed since, then the rest (skipped
# when certified): a run stopped by CERTIFY_S has added as many keys as it could (ORDER=given keeps the file's order)
if [ "${ORDER:-missing-first}" != given ]; then
  PYTHONPATH=/tmp/notorch python3 -m nbxcert coverage --profile "$PROFILE" --keys "$dest/keys.jsonl" --dir "$CERT_DIR" \
    --memory-class "$CLASS" --min 0 --json > "$dest/coverage_before.json" \
    || { echo "gpu_certify.sh: nbxcert coverage of the keys failed (above); nothing certified"; exit 1; }
  python3 "$(dirname "$0")/order_keys.py" "$dest/keys.jsonl" "$dest/coverage_before.json"
fi
extra=()
[ "${FORCE:-0}" = 1 ] && extra=(--force)
[ -n "${AHEAD:-}" ] && extra+=(--ahead "$AHEAD")
echo "$(wc -l < "$dest/keys.jsonl") keys of ${KEYS:-$WORKLOADS} over $SHARDS shard(s), $JOBS compile jobs each"
start=$(date +%s)
touch "$dest/.started"  # the certificate files written from here on are packed below
for i in $(seq 0 $(( SHARDS - 1 ))); do
  # each shard's float64 oracles (numpy's BLAS) get its share of the cores, not all of them each
  CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
  PYTHONPATH=/tmp/notorch timeout -s INT "${CERTIFY_S:-0}" python3 -m nbxcert certify \
    --profile "$PROFILE" --keys "$dest/keys.jsonl" --out "$CERT_DIR" --shard "$i/$SHARDS" --jobs "$JOBS" \
    ${extra[@]+"${extra[@]}"} > "$dest/certify_shard$i.log" 2>&1 &
done
wait
echo "certify: $SHARDS shard(s) ended after $(( $(date +%s) - start )) s"
# keys a minute, the parts' shares and each kernel's time (`by_kernel`), from the shards' logs
PYTHONPATH=/tmp/notorch python3 benchmarks/bench_certified.py throughput "$dest"/certify_shard*.log \
  > "$dest/throughput.json" 2>&1
for w in $WORKLOADS; do
  PYTHONPATH=/tmp/notorch python3 -m nbxcert coverage --profile "$PROFILE" --workload "$w" --dir "$CERT_DIR" \
    --memory-class "$CLASS" 2>&1 | tail -1 | tee "$dest/coverage_$w.txt"
done
# the certificate files this run wrote, alone (a whole directory of them is tens of MB), into written.tar.gz, cut into
# parts of PACK_MB (default 15) where it is larger: `cat written.tar.gz.part-* | tar xzf -` in the checkout unpacks them
find "$CERT_DIR" -type f -name '*.json' -newer "$dest/.started" | sort > "$dest/written.txt"
tar czf "$dest/written.tar.gz" -T "$dest/written.txt"
if [ "$(stat -c %s "$dest/written.tar.gz")" -gt $(( ${PACK_MB:-15} * 1000000 )) ]; then
  split -b "${PACK_MB:-15}000000" "$dest/written.tar.gz" "$dest/written.tar.gz.part-" && rm "$dest/written.tar.gz"
fi
echo "certificate files written: $(wc -l < "$dest/written.txt"), packed in $(cd "$dest" && ls written.tar.gz* | xargs)"
