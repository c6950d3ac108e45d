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
  # A Triton cache carried from an earlier call (`carry: [".triton-carry"]`; `triton_cache_pack` below wrote its
  # parts): the kernels in it load instead of compiling again. Cold-start runs use empty caches of their own.
  if ls .triton-carry/triton_cache.tgz.* > /dev/null 2>&1; then
    mkdir -p "${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
    cat .triton-carry/triton_cache.tgz.* | tar xzf - -C "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" \
      && echo "carried Triton cache: $(find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name '*.cubin' | wc -l) kernels"
  fi
  export NBXCERT_INSTALLED=1
fi

# Pack this machine's Triton cache for the next call: only what loading a compiled kernel needs (each kernel's
# metadata and group JSON and its cubin; the group's other files are skipped when missing), in parts of 15 MiB under
# $OUT, at most $1 parts (a call returns 8 files of 16 MiB); a cache too large for them is not packed, and says so.
triton_cache_pack() {
  local cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache} max=${1:-3} tmp=/tmp/triton_cache.tgz
  [ -d "$cache" ] || return 0
  (cd "$cache" && find . -name '*.cubin' -o -name '*.json' | tar czf "$tmp" -T -)
  local size=$(stat -c %s "$tmp")
  if [ "$size" -gt $(( max * 15 * 1024 * 1024 )) ]; then
    echo "Triton cache not packed: $(( size / 1048576 )) MiB is over $max parts of 15 MiB"
  else
    split -b 15M "$tmp" "$OUT/triton_cache.tgz." && echo "Triton cache packed: $(( size / 1048576 )) MiB"
  fi
  rm -f "$tmp"
}
