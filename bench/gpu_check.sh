#!/usr/bin/env bash
# GPU check: on one NVIDIA GPU, run `hetpar calibrate` and a single-GPU training run of a
# ~1B-parameter Llama-style model, and print the measured matmul efficiency and step time
# beside what the catalog entry for that GPU predicts (hetpar simulate).
#
# Usage: bench/gpu_check.sh            (from the repository root; needs torch==2.13.0 + CUDA)
#   HETPAR_GPU=H100-SXM5-80GB  catalog entry to compare with (default: from nvidia-smi's name)
#   STEPS=40 GBS=8 MBS=4         training run size (default: about a minute on an H100)
#   OUT=dir                      where files go (default: a temporary directory)
#   DEVICE=cpu SMALL=1 HETPAR_GPU=H100-SXM5-80GB   smoke-test this script without a GPU
#                                (a 4-layer model, few steps; the figures mean nothing then)
# Exit status: 0 when every self-check passed, 1 otherwise (a failed check says which).
set -euo pipefail

PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
STEPS=${STEPS:-40}
GBS=${GBS:-8}
MBS=${MBS:-4}
OUT=${OUT:-$(mktemp -d -t hetpar-gpu-XXXXXX)}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"

fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }

if [ "$DEVICE" = cuda ]; then
  command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU"
  RAW=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
else
  RAW="(none: $DEVICE smoke test)"
fi
if [ -z "${HETPAR_GPU:-}" ]; then
  case "$RAW" in
    *H200*) HETPAR_GPU=H200-SXM-141GB ;;
    *GH200*) HETPAR_GPU=GH200-96GB ;;
    *H100*) HETPAR_GPU=H100-SXM5-80GB ;;
    *B200*) HETPAR_GPU=B200 ;;
    *A100*80GB*) HETPAR_GPU=A100-SXM4-80GB ;;
    *A100*) HETPAR_GPU=A100-SXM4-40GB ;;
    *V100*) HETPAR_GPU=V100-SXM2-32GB ;;
    *L40S*) HETPAR_GPU=L40S ;;
    *4090*) HETPAR_GPU=RTX-4090 ;;
    *3090*) HETPAR_GPU=RTX-3090 ;;
    *MI300X*) HETPAR_GPU=MI300X ;;
    *) fail "no catalog entry known for GPU '$RAW'; set HETPAR_GPU to a catalog name" ;;
  esac
fi
echo "gpu_check: GPU '$RAW' compared with catalog entry $HETPAR_GPU; files in $OUT"

# A ~1B-parameter Llama-style model (Llama-3.2-1B-like widths, 32k vocabulary).
cat > "$OUT/llama-1b.toml" <<'EOF'
name = "llama-1b-check"
n_layers = 16
hidden = 2048
n_heads = 16
n_kv_heads = 8
ffn_hidden = 5632
vocab = 32000
seq_len = 2048
mlp = "swiglu"
norm = "rmsnorm"
position = "rope"
bias = false
tied_embeddings = false
source = "hetpar gpu_check model"
EOF
cat > "$OUT/one-gpu.toml" <<EOF
name = "one-gpu"
[[node_groups]]
name = "g"
gpu = "$HETPAR_GPU"
num_nodes = 1
gpus_per_node = 1
EOF
if [ -n "${SMALL:-}" ]; then
  sed -i 's/^n_layers = 16/n_layers = 2/; s/^hidden = 2048/hidden = 128/; s/^ffn_hidden = 5632/ffn_hidden = 256/; s/^vocab = 32000/vocab = 512/; s/^seq_len = 2048/seq_len = 64/; s/^n_heads = 16/n_heads = 4/; s/^n_kv_heads = 8/n_kv_heads = 2/' "$OUT/llama-1b.toml"
fi
PLAN="gbs=$GBS,mbs=$MBS,precision=bf16"
DTYPE=bfloat16
QUICK=""
if [ "$DEVICE" != cuda ]; then PLAN="gbs=$GBS,mbs=$MBS,precision=fp32"; DTYPE=float32; QUICK=--quick; fi

echo "gpu_check: [1/3] hetpar calibrate"
$PY -m hetpar.cli.main calibrate --device "$DEVICE" --gpu "$HETPAR_GPU" --ranks 1 $QUICK \
  --out "$OUT/calib.toml" --json > "$OUT/calibrate.json" || fail "hetpar calibrate"

echo "gpu_check: [2/3] hetpar run ($STEPS steps, plan $PLAN)"
$PY -m hetpar.cli.main run --model "$OUT/llama-1b.toml" --plan "$PLAN" --device "$DEVICE" \
  --dtype "$DTYPE" --lr 1e-4 --steps "$STEPS" --timeout 300 --json > "$OUT/run.json" \
  || fail "hetpar run"

echo "gpu_check: [3/3] hetpar simulate with the catalog entry and with the calibrated file"
$PY -m hetpar.cli.main simulate --model "$OUT/llama-1b.toml" --cluster "$OUT/one-gpu.toml" \
  --plan "$PLAN" --json > "$OUT/sim_catalog.json" || fail "hetpar simulate (catalog)"
$PY -m hetpar.cli.main simulate --model "$OUT/llama-1b.toml" --cluster "$OUT/calib.toml" \
  --plan "$PLAN" --json > "$OUT/sim_calibrated.json" || fail "hetpar simulate (calibrated)"

OUT="$OUT" SMALL="${SMALL:-}" $PY - <<'EOF'
import json, math, os, sys
from hetpar import formulas
from hetpar.catalog import load_model

out = os.environ["OUT"]
cal = json.load(open(f"{out}/calibrate.json"))
run = json.load(open(f"{out}/run.json"))
cat = json.load(open(f"{out}/sim_catalog.json"))
calsim = json.load(open(f"{out}/sim_calibrated.json"))
model = load_model(f"{out}/llama-1b.toml")
problems = []

print(f"\nmodel: {formulas.params(model) / 1e9:.2f} B parameters")
print(f"matmul ({cal['precision']}, square n^3)   measured fraction   catalog predicts")
pred = dict((s, f) for s, f in cal["catalog_matmul_fraction"])
for size, frac in cal["matmul"]:
    print(f"  {size:12.3g} FLOP          {frac:8.3f}            {pred[size]:8.3f}")
big = cal["matmul"][-1]
print(f"largest matmul: {big[1] * cal['peak_tflops']:.0f} TFLOP/s measured "
      f"({big[1]:.1%} of the {cal['peak_tflops']:.0f} TFLOP/s peak)")

measured = run["median_step_s"]
print(f"\nstep time: measured {measured:.4f} s (median of {len(run['step_times_s']) - 1} "
      f"steps after the first)")
for name, rep in (("catalog", cat), ("calibrated", calsim)):
    p = rep["iteration_time_s"]
    print(f"           {name:10} predicts {p:.4f} s  ({(p - measured) / measured:+.1%}), "
          f"MFU {rep['mfu']:.1%}")
# The simulator's MFU scales inversely with step time at fixed model FLOPs.
print(f"           measured MFU {cat['mfu'] * cat['iteration_time_s'] / measured:.1%}")

# Self-checks: numbers that cannot be right mean the check itself is broken.
losses = run["losses"]
if not os.environ["SMALL"] and not 0.5e9 < formulas.params(model) < 1.5e9:
    problems.append("model is not ~1B parameters")
if not all(math.isfinite(x) for x in losses):
    problems.append(f"non-finite loss: {losses}")
elif not losses[-1] < losses[0]:
    problems.append(f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}")
if not all(0 < f <= 1 for _, f in cal["matmul"]):
    problems.append("matmul fraction outside (0, 1]: wrong peak or timing")
if not 0 < measured < 600:
    problems.append(f"implausible step time {measured}")
if cat.get("oom"):
    problems.append("the simulator says this plan does not fit the GPU")
for p in problems:
    print(f"gpu_check: FAILED: {p}", file=sys.stderr)
print("\ngpu_check: " + ("all self-checks passed" if not problems else "FAILED"))
sys.exit(1 if problems else 0)
EOF
