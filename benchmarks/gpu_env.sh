# Sourced by the GPU scripts (gpu_check.sh, gpu_pair.sh, gpu_certify.sh, gpu_verify.sh): install nbxcert from the
# working tree (skipped where NBXCERT_INSTALLED=1 is set, as it is for a script started by another), make torch
# unimportable in every process started with PYTHONPATH=/tmp/notorch (a sitecustomize whose meta_path finder refuses
# it: nbxcert must not need torch), and set SHARDS (one per GPU unless given) and JOBS (each shard's share of the CPU
# cores). Needs nvidia-smi and Python 3.10+ with nbxcert's dependencies installed.
export PYTHONUNBUFFERED=1
SHARDS=${SHARDS:-$(nvidia-smi -L | wc -l)}
JOBS=$(( $(nproc) / SHARDS )); [ "$JOBS" -ge 1 ] || JOBS=1
# once per run: a script started by another (gpu_pair.sh runs two gpu_check.sh at once) finds NBXCERT_INSTALLED set
# and neither installs again nor rewrites the sitecustomize while the other's processes may be reading it
if [ -z "${NBXCERT_INSTALLED:-}" ]; then
  python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
  mkdir -p /tmp/notorch
  cat > /tmp/notorch/sitecustomize.py <<'PY'
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is hidden in this run (nbxcert must not need it)")
        return None
sys.meta_path.insert(0, _NoTorch())
PY
  export NBXCERT_INSTALLED=1
fi

