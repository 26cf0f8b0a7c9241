#!/usr/bin/env bash
# The bench as run on a lent GPU machine (no network there): install the pinned wheels carried
# in .whl/, then `python -m bench.run` with the shared reference scripts copied to .bench-shared/.
# Everything lands in $OUT: bench.log (the summary) and bench.tgz (results, calibration, child logs).
#   bash bench/device.sh [bench.run flags, e.g. --phases compare,layers --budget-s 520]
set -uo pipefail
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site
# NVLink multicast stays off on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,power.limit --format=csv
python3 - <<'PY'
import importlib.metadata as m
names = ["torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "datasets", "pyarrow", "fsspec",
         "huggingface_hub", "tokenizers", "regex", "safetensors"]
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:  # a phase that needs none of it carries no wheel of it
        return None
print({n: version(n) for n in names})
PY
python3 -m bench.run --shared .bench-shared --results "$OUT/results" --logs "$OUT/logs" --work /tmp/fb "$@" \
  2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
tar -C "$OUT" -czf "$OUT/bench.tgz" results logs calibration 2>/dev/null
rm -rf "$OUT/results" "$OUT/logs" "$OUT/calibration"
exit "$rc"
