#!/bin/bash
# Issue 36's GPU checks in one call of about 9 minutes (each step under its own time limit):
#   OUT=<folder> bash benchmarks/gpu_issue36.sh            # on a CUDA machine, from the repo root
#   OUT=<folder> bash benchmarks/gpu_issue36.sh --small    # a dry run on a CPU (numbers mean nothing)
# Steps, each writing <step>.json / .txt / .err under $OUT (a temporary folder when unset):
#   probe36       gpu_probe.py --issue 36: M = 10⁶, d = 784, β = 10, Q = 1 / 16384 / 1024,
#                 bfloat16 (and float32): dense against the two GEMMs (and the first alone, and
#                 with float32 scores), Q = 1 against reading the memories once at the copy
#                 bandwidth measured in the same run, topk against mm + topk, sparse, entmax
#                 (α = 1.5 and 1.25) and random (k = 0.2·M) against dense; the targets met or not
#   heads         heads_padding.py: multihead with padded heads against dense, bfloat16
#   entmax_fused  entmax_fused.py: the fused entmax kernel (α = 1.5, 1.25) and random's mask
#                 against dense at the regimes' sizes (M = 60,000)
#   pytest        NPH_TEST_DEVICE=cuda python -m pytest -q -x (on a CPU run: the entmax tests)
# Limits in seconds: PROBE_S, HEADS_S, FUSED_S, TEST_S. NPH_BENCH_COMMIT names the commit where the
# checkout's history is not the code's (a copied working tree).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
device=cuda small=() fused_s=60
if [ "${1:-}" = "--small" ]; then device=cpu small=(--small) fused_s=600; fi
began=$(date +%s)

step() {  # step NAME LIMIT_S COMMAND...: run it under its limit, report rc, time and its tail
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  echo "== $name: rc $? in $(( $(date +%s) - t0 )) s (limit $limit s)"
  tail -n "${TAIL:-30}" "$OUT/$name.txt"
}

if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() \
  if torch.cuda.is_available() else 'no cuda')" | tee -a "$OUT/gpu.txt"
echo "commit ${NPH_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" | tee -a "$OUT/gpu.txt"

step probe36 "${PROBE_S:-250}" python3 benchmarks/gpu_probe.py --device "$device" "${small[@]}" \
  --issue 36 --time-s "${PROBE_TIME_S:-190}" --out "$OUT/probe36.json"
TAIL=12 step heads "${HEADS_S:-100}" python3 benchmarks/heads_padding.py --device "$device" \
  "${small[@]}" --rounds 3 --time-s 60 --out "$OUT/heads.json"
TAIL=12 step entmax_fused "${FUSED_S:-$fused_s}" python3 benchmarks/entmax_fused.py --device "$device" \
  "${small[@]}" --rounds 2 --out "$OUT/entmax_fused.json"
if [ "$device" = cuda ]; then
  TAIL=15 step pytest "${TEST_S:-150}" env NPH_TEST_DEVICE=cuda python3 -m pytest -q -x -n 8 \
    -p no:cacheprovider
else
  TAIL=3 step pytest "${TEST_S:-150}" python3 -m pytest -q -x -n 0 -p no:cacheprovider \
    tests/models/test_entmax_any_alpha.py
fi
echo "== all steps in $(( $(date +%s) - began )) s; results in $OUT"
