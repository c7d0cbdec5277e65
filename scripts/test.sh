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
# Extra arguments: one pytest run with them, as given.
if [ $# -gt 0 ]; then exec .venv/bin/python -m pytest "$@"; fi
# Default: every test except the "heavy" end-to-end fault runs (scripts/test.sh -m heavy runs those), so the suite
# fits CI's time on 2 cores. Both selections run on one worker per core (pytest-xdist). The unit tests are short
# single-threaded processes: two at once take about half the time. An integration test spends about 40% of its time
# waiting (engine and job start-up, Slurm's scheduler, polls on markers), so a second one beside it fills the idle
# core; `--dist loadgroup` with the groups set in tests/conftest.py keeps every test that needs the Slurm cluster on
# one worker, one at a time, and a module's tests (and its engine fixture) together.
status=0
.venv/bin/python -m pytest tests/unit -m "not heavy" -n 2 --durations=20 || status=$?
.venv/bin/python -m pytest tests/integration -m "not heavy" -n 2 --dist loadgroup --durations=60 || status=$?
exit "$status"
