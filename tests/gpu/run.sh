#!/usr/bin/env bash
# GPU readiness of srl's trainer on one GPU: MFU of its train step on a 0.5B Qwen3-shaped model (bf16, packed
# RL-like batches, plain and FSDP2), and its checkpoint and weight-broadcast write rates (tests/gpu/bench.py says
# exactly what is measured). Finishes in under 8 minutes on one H100/H200; prints one line per figure.
#
#   tests/gpu/run.sh                      # on a machine with a CUDA GPU and PyTorch
#   tests/gpu/run.sh --cpu                # CPU dry mode with srl's tiny model shape (CI runs this; seconds)
#   tests/gpu/run.sh --peak-tflops 989    # other bench.py options pass through (--samples, --seq-len, --dir ...)
#
# Needs PyTorch, numpy, pydantic, safetensors and transformers; no vLLM, no network. The interpreter is
# $SRL_PYTHON, else this checkout's .venv/bin/python, else python3. On a machine that lacks some of those modules
# and reaches no package registry, give a directory of wheels built elsewhere
# (pip download -d DIR transformers safetensors pydantic numpy) as SRL_GPU_WHEELS=DIR: they are installed from
# there with pip --no-index --user before the run.
set -euo pipefail
cd "$(dirname "$0")/../.."

py=${SRL_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi

missing_modules() {
  "$py" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("torch", "numpy", "pydantic", "safetensors", "transformers")
               if importlib.util.find_spec(m) is None))
EOF
}

missing=$(missing_modules)
if [ -n "$missing" ] && [ -n "${SRL_GPU_WHEELS:-}" ]; then
  echo "installing $missing from $SRL_GPU_WHEELS (no index)" >&2
  # shellcheck disable=SC2086 # one word per module
  "$py" -m pip install -q --no-index --find-links "$SRL_GPU_WHEELS" --user $missing
  missing=$(missing_modules)
fi
if [ -n "$missing" ]; then
  echo "error: $py cannot import: $missing. Install them (pip install $missing), or give a directory of wheels" \
       "as SRL_GPU_WHEELS=DIR (pip download -d DIR $missing, on a machine that reaches PyPI)." >&2
  exit 2
fi

# 470 s leaves room under the 8 minutes for interpreter start-up and the teardown of CUDA.
start=$(date +%s)
status=0
timeout --signal=TERM --kill-after=10 470 "$py" tests/gpu/bench.py "$@" || status=$?
echo "tests/gpu/run.sh: $(( $(date +%s) - start )) s, status $status"
if [ "$status" = 124 ]; then echo "error: did not finish within 470 s" >&2; fi
exit "$status"
