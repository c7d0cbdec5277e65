#!/usr/bin/env bash
# Set up srl and run the whole test suite: unit tests, then integration tests on a real local Slurm cluster
# (Debian slurm-wlm, started by .ci/setup-slurm.sh) and real vLLM on CPU. Extra arguments go to pytest,
# e.g. scripts/test.sh -m "not slow" for the quick unit tests only, scripts/test.sh -m heavy for the long
# end-to-end fault runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Headless Chromium for the HTML report test (Debian package; the Slurm packages are installed by the fixture).
# Without it the test is skipped on a developer's machine; under CI (CI=true) the run stops here, since a CI that
# passes without running the test would be green for nothing (tests/prereqs.py says the same for everything else).
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
      || true
  fi
  ci=${CI:-}
  if ! command -v chromium >/dev/null; then
    case ${ci,,} in
      1 | true | yes)
        echo "error: CI=true, but Chromium is not installed and could not be installed (needs root and apt-get:" \
             "apt-get install -y chromium); the report screenshot test needs it" >&2
        exit 1 ;;
      *) echo "warning: Chromium is not installed; the report screenshot test will be skipped" >&2 ;;
    esac
  fi
fi
# The Slurm fixture in tests/conftest.py starts (and stops) the local test cluster itself when a test needs it.
# Default: every test except the "heavy" end-to-end fault runs (scripts/test.sh -m heavy runs those), so the suite
# fits CI's 90 minutes on 2 cores.
if [ $# -eq 0 ]; then set -- -m "not heavy" --durations=60; fi
exec .venv/bin/python -m pytest "$@"
