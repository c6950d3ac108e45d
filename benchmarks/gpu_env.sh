# Sourced by the device-call scripts (gpu_certify.sh, gpu_verify.sh): install nbxcert from the working tree, make
# torch unimportable in every process started with PYTHONPATH=/tmp/notorch (a sitecustomize whose meta_path finder
# refuses it), and set SHARDS (one per GPU unless given) and JOBS (each shard's share of the CPU cores).
export PYTHONUNBUFFERED=1
SHARDS=${SHARDS:-$(nvidia-smi -L | wc -l)}
JOBS=$(( $(nproc) / SHARDS )); [ "$JOBS" -ge 1 ] || JOBS=1
# once per call: a script started by another (gpu_pair.sh runs two gpu_check.sh at once) finds NBXCERT_INSTALLED set
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
