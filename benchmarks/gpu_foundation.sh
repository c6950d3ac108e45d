#!/usr/bin/env bash
# The foundation on an NVIDIA GPU, into an output directory:
#
#   bash benchmarks/gpu_foundation.sh OUTDIR
#
# Installs nbxcert from the working tree, then `nbxcert doctor` (OUTDIR/doctor.txt, doctor.json), the GPU tests of the
# backends, the tensor layer, device agreement and doctor (OUTDIR/gpu_tests.txt), and a sweep of the test-only
# `fault_probe` kernel that meets real faults on the GPU: a wrong result, a compile failure, an illegal address and an
# endless loop, each refused with its own reason while the correct candidate is certified (OUTDIR/fault_sweep.txt, the
# certificate under OUTDIR/fault_certs). Needs one NVIDIA GPU of the profile the sweep certifies for (PROFILE, default
# hopper: an H100 or H200) and nvidia-smi (OUTDIR/nvidia-smi.txt).
USAGE="bash benchmarks/gpu_foundation.sh OUTDIR"
source "$(dirname "$0")/gpu_outdir.sh"
export PYTHONUNBUFFERED=1
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$dest/nvidia-smi.txt"
python3 -m nbxcert doctor 2>&1 | tee "$dest/doctor.txt"; echo "doctor exit: ${PIPESTATUS[0]}" | tee -a "$dest/doctor.txt"
python3 -m nbxcert doctor --json > "$dest/doctor.json" 2>&1
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/backends tests/engine/test_device_agreement.py \
  tests/cli/test_cli_doctor.py tests/kernels/test_tensor.py 2>&1 | tee "$dest/gpu_tests.txt" | tail -25
rm -rf "$dest/fault_certs"
PYTHONPATH=tests/fixtures timeout 300 python3 -m nbxcert certify --profile "${PROFILE:-hopper}" \
  --key 'fault_probe[n=300000;float32]@v1' --kernels fault_probe --spec faulty_kernels --out "$dest/fault_certs" \
  --timeout 30 --json 2>&1 | tee "$dest/fault_sweep.txt" | tail -30
