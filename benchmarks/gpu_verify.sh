#!/usr/bin/env bash
# One device call of issue #8's check: `nbxcert verify --profile hopper --workload W --certified-only` for each of
# $WORKLOADS, split into one `--shard i/N` per GPU (CUDA_VISIBLE_DEVICES=i) run at once, torch made unimportable in
# every process. Each shard prints its `[nbxcert] verify (shard i/N): ...` line; $OUT/verify_W.txt holds them all.
set -u
export PYTHONUNBUFFERED=1
WORKLOADS=${WORKLOADS:-tinyllama-1.1b}
SHARDS=${SHARDS:-$(nvidia-smi -L | wc -l)}
JOBS=$(( $(nproc) / SHARDS )); [ "$JOBS" -ge 1 ] || JOBS=1
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
mkdir -p /tmp/notorch /tmp/verify-logs
cat > /tmp/notorch/sitecustomize.py <<'PY'
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is hidden in this run (nbxcert must not need it)")
        return None
sys.meta_path.insert(0, _NoTorch())
PY
for w in $WORKLOADS; do
  start=$(date +%s)
  for i in $(seq 0 $(( SHARDS - 1 ))); do
    CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=$JOBS OPENBLAS_NUM_THREADS=$JOBS MKL_NUM_THREADS=$JOBS \
      PYTHONPATH=/tmp/notorch python3 -m nbxcert verify --profile hopper --workload "$w" \
      --dir certificates --certified-only --shard "$i/$SHARDS" > "/tmp/verify-logs/$w.$i.log" 2>&1 &
  done
  wait
  { for i in $(seq 0 $(( SHARDS - 1 ))); do grep -h "^\[nbxcert\] verify\|^missing\|^mismatched" "/tmp/verify-logs/$w.$i.log"; done
    echo "verify of $w: $(( $(date +%s) - start )) s"; } | tee "$OUT/verify_$w.txt"
done
tar czf "$OUT/verify_logs.tgz" /tmp/verify-logs 2>/dev/null
