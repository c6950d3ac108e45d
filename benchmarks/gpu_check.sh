#!/usr/bin/env bash
# GPU tests and benchmarks of nbxcert, one set at a time, into an output directory:
#
#   bash benchmarks/gpu_check.sh SET OUTDIR
#
# Needs one NVIDIA GPU of the profile the certificates and the figures are for (nvidia/hopper: an H100 or H200; the
# figures in benchmarks/README.md are an H200's), on an otherwise idle machine for the figures to compare (set `cold`
# uses every GPU of the machine; gpu_pair.sh runs two sets at once on a machine of two), nvidia-smi, and torch with
# CUDA for the benchmarks' peers. The GPU tests run with torch unimportable (PYTHONPATH=/tmp/notorch, see gpu_env.sh);
# the peers run in their own processes.
#
# Each step runs under its own time limit (SIGINT, then the next step), its whole output in OUTDIR/<step>.txt and one
# line in OUTDIR/summary.txt (exit status, seconds), which starts with the GPU, its driver and the versions in use;
# each benchmark's JSON is OUTDIR/<step>.json (bench_dispatch.py and bench_model.py write their own files there).
#
# Sets:
#   core      the device judge, warm and the fault sweep (tests/kernels/test_judge.py, test_warm.py, tests/engine/test_sweep_faults.py and test_provenance.py), the
#             row and element-wise kernels' GPU tests, then bench_autotune.py (AUTOTUNE=0 leaves it out)
#   families  the sampling, quantized-weight, MoE and vision kernels' GPU tests, then bench_sampling.py,
#             bench_quant.py, bench_vision.py and bench_moe.py
#   matmul    the matmul family's GPU tests (every kept candidate at real shapes), then bench_matmul.py
#   serving   the CUDA backend's, the launch plans' and the graphs' GPU tests (tests/kernels/backends/test_cuda.py,
#             tests/kernels/test_served_plans.py, tests/engine/test_graphs.py), then bench_alloc.py (4096 x 4096 and 1 x 4096, against cuMemAlloc/cuMemFree),
#             bench_certified.py serving, bench_dispatch.py and bench_model.py (llama-3-8b's decoder layer)
#   quality   bench_certified.py quality of $WORKLOAD's certified keys; one shard of them per GPU through gpu_pair.sh:
#               QUALITY_OF=2 WORKLOAD=llama-3-8b bash benchmarks/gpu_pair.sh quality quality OUTDIR
#             each shard taking the GPU it was given (shard = QUALITY_FIRST + the GPU's index) and half the cores;
#             QUALITY_KERNELS=flash_attention,decode_attention measures those kernels' keys alone; QUALITY_S=S stops
#             measuring keys PEER_S (110) seconds before S so the peer is still timed over the keys measured, and
#             QUALITY_START_<gpu>=N goes on from where a stopped shard's JSON says it stopped
#   cold      bench_certified.py coldstart of $WORKLOAD (every run a fresh process, an empty Triton cache of its own):
#             the certified and warmed runs at once, then the run-time sweep and triton.autotune's procedure at once,
#             dealt over every GPU of the machine; the warmed run compiles its winners in the background
#             (nbxcert.warm.start; COLD_WARM=block: before the first launch), whose GPU test runs first; the sweep and
#             autotune are cut after COLD_SWEEP_S (360) seconds
#   bundle    the compiled-binaries GPU test (tests/kernels/backends/test_binaries_gpu.py), then `nbxcert bundle` of
#             $WORKLOAD's certified winners into OUTDIR/$WORKLOAD.nbxbundle (cross-compiled on every core) and
#             bench_certified.py coldstart serving from it, beside the certified run that compiles at first launch
#             (COLD_RUNS, default "bundled,bundled_index,certified"; every run a fresh process with an empty Triton cache)
set -u
SET=${1:-}
case "$SET" in
  core | families | matmul | serving | quality | cold | bundle) ;;
  *) SET= ;;
esac
if [ -z "$SET" ] || [ -z "${2:-}" ]; then
  echo "usage: bash benchmarks/gpu_check.sh SET OUTDIR (SET: core, families, matmul, serving, quality, cold or bundle)" >&2
  exit 2
fi
mkdir -p "$2" && dest=$(cd "$2" && pwd)
source "$(dirname "$0")/gpu_env.sh"
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout -s INT -k 20 "$limit" "$@" > "$dest/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$dest/summary.txt"
  tail -4 "$dest/$name.txt"
  return $rc
}
TESTS=(env PYTHONPATH=/tmp/notorch python3 -m pytest -q -p no:cacheprovider -m gpu --durations=12)
NOTORCH=(env PYTHONPATH=/tmp/notorch)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$dest/summary.txt"
python3 -c "import sys, triton; print('Python', sys.version.split()[0], 'Triton', triton.__version__)" \
  | tee -a "$dest/summary.txt"
python3 -c "import torch; print('torch', torch.__version__)" 2>/dev/null | tee -a "$dest/summary.txt"
case "$SET" in
  core)
    step tests_core 150 "${TESTS[@]}" tests/kernels/test_judge.py tests/engine/test_warm.py \
      tests/engine/test_sweep_faults.py tests/engine/test_provenance.py
    step tests_rows_elementwise 230 "${TESTS[@]}" tests/kernels/test_rows.py tests/kernels/test_elementwise.py
    # the sweep's timing replay and the inputs' device draws, on this GPU (not marked gpu: they run everywhere)
    step tests_replay_draws 200 "${NOTORCH[@]}" python3 -m pytest -q -p no:cacheprovider \
      tests/kernels/test_launch.py tests/kernels/test_inputs.py -k "timed_launch_replays or not_replayed or device_draw or draws_a_large or compile_only"
    if [ "${AUTOTUNE:-1}" = 1 ]; then
      step bench_autotune 190 python3 benchmarks/bench_autotune.py --keys 2 --out "$dest/bench_autotune.json"
    fi
    ;;
  families)
    step tests_families 600 "${TESTS[@]}" tests/kernels/test_sampling.py tests/kernels/test_quant.py \
      tests/kernels/test_moe.py tests/kernels/test_vision.py
    step bench_sampling 120 python3 benchmarks/bench_sampling.py --warmup 10 --rep 40 --out "$dest/bench_sampling.json"
    step bench_quant 240 python3 benchmarks/bench_quant.py --warmup 10 --rep 40 --out "$dest/bench_quant.json"
    step bench_vision 120 python3 benchmarks/bench_vision.py --warmup 10 --rep 40 --out "$dest/bench_vision.json"
    step bench_moe 900 python3 benchmarks/bench_moe.py --warmup-ms 10 --rep-ms 40 --out "$dest/bench_moe.json"
    ;;
  matmul)
    step tests_matmul 240 "${TESTS[@]}" tests/kernels/test_matmul.py
    step bench_matmul 420 python3 benchmarks/bench_matmul.py --out "$dest/bench_matmul.json"
    ;;
  serving)
    step tests_serving 200 "${TESTS[@]}" tests/kernels/backends/test_cuda.py tests/kernels/test_served_plans.py \
      tests/engine/test_graphs.py
    step bench_alloc_4096x4096 60 "${NOTORCH[@]}" python3 benchmarks/bench_alloc.py --rows 4096 --cols 4096 \
      --calls 2000 --compare-driver --out "$dest/bench_alloc_4096x4096.json"
    step bench_alloc_1x4096 60 "${NOTORCH[@]}" python3 benchmarks/bench_alloc.py --rows 1 --cols 4096 \
      --calls 5000 --compare-driver --out "$dest/bench_alloc_1x4096.json"
    step bench_serving 100 "${NOTORCH[@]}" python3 benchmarks/bench_certified.py serving --profile \
      --out "$dest/bench_serving.json"
    # torch visible: their peers are torch eager in a process of its own (each refuses torch in its own process)
    step bench_dispatch 300 python3 benchmarks/bench_dispatch.py --out "$dest"
    step bench_model 450 python3 benchmarks/bench_model.py --out "$dest"
    ;;
  quality)
    of=${QUALITY_OF:-1}
    gpu=${CUDA_VISIBLE_DEVICES:-0}
    start_var=QUALITY_START_$gpu
    limit=0  # no limit
    stop=()
    if [ -n "${QUALITY_S:-}" ]; then
      limit=$QUALITY_S stop=(--stop-after "$(( QUALITY_S - ${PEER_S:-110} ))")
    fi
    step quality "$limit" python3 benchmarks/bench_certified.py quality --workload "${WORKLOAD:?}" --dir certificates \
      --shard "$(( ${QUALITY_FIRST:-0} + gpu ))/$of" --jobs $(( $(nproc) / (of < 2 ? 1 : 2) )) \
      --start "${!start_var:-0}" ${stop[@]+"${stop[@]}"} ${QUALITY_KERNELS:+--kernels "$QUALITY_KERNELS"} \
      --out "$dest/quality.json"
    ;;
  cold)
    gpus=$(seq -s, 0 $(( $(nvidia-smi -L | wc -l) - 1 )))
    step tests_warm 90 "${TESTS[@]}" tests/engine/test_warm.py -k start
    step coldstart 1800 python3 benchmarks/bench_certified.py coldstart --workload "${WORKLOAD:?}" \
      --dir certificates --gpus "$gpus" --certified-limit 150 --sweep-limit "${COLD_SWEEP_S:-360}" --autotune \
      --warm "${COLD_WARM:-background}" --out "$dest/coldstart.json"
    ;;
  bundle)
    step tests_binaries 300 "${TESTS[@]}" tests/kernels/backends/test_binaries_gpu.py
    step bundle_build 900 nbxcert bundle --profile hopper --workload "${WORKLOAD:?}" --dir certificates \
      --out "$dest/$WORKLOAD.nbxbundle" --jobs "$(nproc)"
    ls -l "$dest/$WORKLOAD.nbxbundle" | tee -a "$dest/summary.txt"
    step coldstart_bundled 900 python3 benchmarks/bench_certified.py coldstart --workload "$WORKLOAD" \
      --dir certificates --bundle "$dest/$WORKLOAD.nbxbundle" --runs "${COLD_RUNS:-bundled,bundled_index,certified}" \
      --certified-limit 300 --out "$dest/coldstart_bundled.json"
    ;;
esac
