#!/usr/bin/env bash
# Build and run benchmarks/launch_cost.c on a GPU machine (gcc, the NVIDIA driver, Triton's cuda.h); the figures are
# printed and written to OUTDIR/launch_cost.txt. Usage: benchmarks/gpu_launch_cost.sh OUTDIR
set -euo pipefail
outdir=${1:?usage: benchmarks/gpu_launch_cost.sh OUTDIR}
mkdir -p "$outdir"
inc=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/include'))")
lib=$(ldconfig -p | awk '/libcuda\.so\.1 / {print $NF; exit}')
bin=$(mktemp)
gcc -O2 -o "$bin" "$(dirname "$0")/launch_cost.c" -I"$inc" "$lib"
"$bin" | tee "$outdir/launch_cost.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$outdir/launch_cost.txt"
rm -f "$bin"
