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
# fits CI's time on 2 cores. Two streams run side by side, each one test at a time:
# - the background half: the tests on the Slurm cluster (marker `slurm`, set in tests/conftest.py; a unit test that
#   asks the cluster too) and the local ones marked `background_half` (chosen so the two streams take about as
#   long). Keeping the cluster's
#   tests to one at a time means none queues behind another's jobs on the 4 nodes (several assert what squeue shows,
#   or that a job starts within a bound);
# - the foreground half: the unit tests (one pytest-xdist worker per core: they are short single-threaded
#   processes), then the other local integration tests.
# An integration test waits about 40% of its time (engine and job start-up, Slurm's scheduler, polls on markers),
# so the other stream fills the idle core; every test waits on events the product records, never on a gap in wall
# time, so the verdict does not depend on this load.
status=0
# Job control: the background half gets a process group of its own, so Ctrl-C (which stops the foreground half) can
# be passed on to it as a Ctrl-C, and its fixtures stop their engines and jobs; its line prefixer ignores Ctrl-C so
# that the half's last words still reach the terminal.
set -m
.venv/bin/python -m pytest tests/integration tests/unit -m "(slurm or background_half) and not heavy" --durations=30 2>&1 \
  | (trap '' INT; exec sed -u 's/^/[background] /') &
background_half=$(jobs -p %1)
local_status=0
.venv/bin/python -m pytest tests/unit -m "not heavy and not slurm" -n 2 --durations=20 || local_status=$?
if [ "$local_status" -ne 2 ]; then
  status=$local_status
  local_status=0
  .venv/bin/python -m pytest tests/integration -m "not slurm and not background_half and not heavy" --durations=40 \
    || local_status=$?
fi
# 2: pytest was interrupted (Ctrl-C) or could not collect the tests (a broken tree): either way the run has failed,
# so the background half is stopped too instead of spending its time.
if [ "$local_status" -eq 2 ]; then kill -INT -- "-$background_half" 2>/dev/null || true; fi
background_status=0
wait %1 || background_status=$?  # the pipeline's status: pytest's (pipefail)
for s in "$local_status" "$background_status"; do [ "$s" -eq 0 ] || status=$s; done
exit "$status"
