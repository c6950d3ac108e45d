#!/usr/bin/env bash
# One device call of the Hopper certification (issues #6/#8): install from the working tree, then
# `nbxcert certify --profile hopper --workload $WORKLOAD` into certificates/nvidia/hopper (resumable: a later call
# continues where this one stopped), with torch made unimportable in every process (a sitecustomize whose meta_path
# finder refuses it), for at most $CERTIFY_S seconds. Certificates and the log come back packed under $OUT.
set -u
export PYTHONUNBUFFERED=1
WORKLOAD=${WORKLOAD:-tinyllama-1.1b}
CERTIFY_S=${CERTIFY_S:-300}
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
mkdir -p certificates/nvidia/hopper
start=$(date +%s)
PYTHONPATH=/tmp/notorch timeout -s INT "$CERTIFY_S" python3 -m nbxcert certify --profile hopper \
  --workload "$WORKLOAD" --out certificates > "$OUT/certify_$WORKLOAD.log" 2>&1
echo "certify exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/certify_$WORKLOAD.log"
PYTHONPATH=/tmp/notorch python3 -m nbxcert coverage --profile hopper --workload "$WORKLOAD" --dir certificates \
  2>&1 | tail -25 | tee "$OUT/coverage_$WORKLOAD.txt"
tar czf "$OUT/hopper_certs.tgz" certificates/nvidia/hopper
