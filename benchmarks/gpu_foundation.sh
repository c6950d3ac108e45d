#!/usr/bin/env bash
# One device call: install from the working tree, doctor, the gpu tests of the foundation, and a sweep that meets
# real faults (illegal address, endless loop) on the GPU. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m nbxcert doctor 2>&1 | tee "$OUT/doctor.txt"; echo "doctor exit: ${PIPESTATUS[0]}" | tee -a "$OUT/doctor.txt"
python3 -m nbxcert doctor --json > "$OUT/doctor.json" 2>&1
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends tests/test_device_agreement.py \
  tests/test_cli_doctor.py tests/test_tensor.py 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
rm -rf /tmp/gcerts
PYTHONPATH=tests/fixtures timeout 300 python3 -m nbxcert certify --profile hopper --key 'fault_probe[n=300000;float32]@v1' \
  --kernels fault_probe --spec faulty_kernels --out /tmp/gcerts --timeout 30 --json 2>&1 | tee "$OUT/fault_sweep.txt" | tail -30
cp /tmp/gcerts/nvidia/hopper/*.json "$OUT/" 2>/dev/null
