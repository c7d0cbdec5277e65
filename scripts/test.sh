#!/usr/bin/env bash
# Set up srl and run the whole test suite: unit tests, then integration tests on a real local Slurm cluster
# (Debian slurm-wlm, started by .ci/setup-slurm.sh) and real vLLM on CPU. Extra arguments go to pytest,
# e.g. scripts/test.sh -m "not slow" for the quick unit tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The Slurm fixture in tests/conftest.py starts (and stops) the local test cluster itself when a test needs it.
if [ $# -eq 0 ]; then set -- -m "slow or not slow"; fi
exec .venv/bin/python -m pytest "$@"
