# Sourced first by the GPU scripts that take one output directory (gpu_certify.sh, gpu_verify.sh,
# gpu_foundation.sh), before anything is installed or run: without OUTDIR ($1), the script's usage line ($USAGE) and
# exit 2; else OUTDIR made and its absolute path in $dest.
set -u
if [ -z "${1:-}" ]; then
  echo "usage: $USAGE" >&2
  exit 2
fi
mkdir -p "$1" && dest=$(cd "$1" && pwd)
