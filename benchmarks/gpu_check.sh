#!/usr/bin/env bash
# GPU check: the deferred watch (no host sync on a healthy step), the locator's key cases on CUDA,
# and the overhead benchmark on CUDA (every size, the floor column and the RL row).
# One script, under 10 minutes, installs nothing from the network: it assumes a Python with a
# CUDA build of PyTorch (run it from the repository root; set PYTHON to choose the interpreter).
#
#   bash benchmarks/gpu_check.sh            # prints one table (markdown) and the test summary
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

"$PYTHON" - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: torch.cuda.is_available() is False — run this on a machine with a GPU")
print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
date -u +"# %Y-%m-%d %H:%M UTC"

# the locator's key cases on the GPU (flags stay on the device; one sync per window of ops)
timeout 120 "$PYTHON" benchmarks/gpu_locate.py --device cuda || true

# the watch without a host sync: healthy steps under torch.cuda.set_sync_debug_mode("error"), a
# log(0) found one step later at its op, plain / floor / watch step times (fused and plain AdamW)
timeout 150 "$PYTHON" benchmarks/gpu_watch_sync.py --device cuda || true

# the overhead table on CUDA
timeout 300 "$PYTHON" benchmarks/overhead.py --device cuda --repeats 5 --no-memory

# two ranks on NCCL (FSDP2; rank 1 alone makes log(0) at step 3): one finding credited to rank 1
# on both ranks, the same step skipped, one model — where the machine has 2 GPUs
if [ "$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    RANKS_DIR="$(mktemp -d)"
    ( cd "$RANKS_DIR" && timeout 240 "$PYTHON" -m torch.distributed.run --nproc_per_node 2 \
        -m nanguard run --policy skip --json ranks.json "$OLDPWD/benchmarks/gpu_ranks.py" >/dev/null 2>ranks.err \
      && "$PYTHON" "$OLDPWD/benchmarks/gpu_ranks.py" --table ranks.json ) \
      || { echo "gpu_ranks: failed"; tail -20 "$RANKS_DIR/ranks.err"; }
else
    echo "# 2 ranks on NCCL: skipped (this machine has fewer than 2 GPUs)"
fi
