#!/usr/bin/env bash
# A task's SFT -> RL recipe: SFT warm-up on the reference episodes of the RL job's train split, then RL from the SFT
# model. Each task directory holds rl.toml, sft.toml (its data.name is the rows file) and rl-after-sft.toml.
#   jobs/sft-then-rl.sh JOB_DIR ROWS [OVERLAY.toml ...]
# 1. writes data/<task>-sft.jsonl (ROWS reference rows of the RL job's own train split and prompts; kept);
# 2. `srl sft chain` runs SFT (JOB_DIR/sft.toml, online eval on the held-out split), then RL
#    (JOB_DIR/rl.toml + rl-after-sft.toml) starting from the SFT run's final model.
# On a Slurm site add the overlay after each config, e.g. for the local test cluster:
#   jobs/sft-then-rl.sh jobs/reverse-text 8000 @ jobs/reverse-text/slurm.toml
# (the chain then submits the SFT job and the RL job behind it with --dependency=afterok).
set -euo pipefail
usage="usage: $0 JOB_DIR ROWS [OVERLAY.toml ...]"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
job=${1%/}
rows=$2
shift 2
case $rows in ''|*[!0-9]*) echo "$usage (ROWS must be a number of rows, got '$rows')" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
for f in rl.toml sft.toml rl-after-sft.toml; do
  [ -f "$job/$f" ] || { echo "$0: $job/$f not found ($usage)" >&2; exit 2; }
done
srl=${SRL:-.venv/bin/srl}
data=data/$(basename "$job")-sft.jsonl
if [ ! -s "$data" ]; then
  "$srl" sft make-data "$data" @ "$job/rl.toml" --taskset.num-train-examples "$rows"
fi
# Overlays (site, deployment) apply to both runs; anything else is refused rather than applied to one of them.
overlays=()
for a in "$@"; do
  case $a in
    @) ;;
    *.toml) overlays+=("@" "$a") ;;
    *) echo "usage: $0 JOB_DIR ROWS [OVERLAY.toml ...] (got '$a'; run srl sft chain yourself for other options)" >&2; exit 2 ;;
  esac
done
status=0
"$srl" sft chain @ "$job/sft.toml" "${overlays[@]}" \
  --then @ "$job/rl.toml" @ "$job/rl-after-sft.toml" "${overlays[@]}" || status=$?
# Exit status 4: the RL run stopped on the zero-signal guard. After a warm-up that solves every training task that
# is the recipe's expected end (RL has nothing left to learn from), so the recipe counts it as done; any other
# non-zero status (a failed role, another stop criterion, Ctrl-C) is passed on.
if [ "$status" -eq 4 ]; then
  echo "sft-then-rl: RL stopped on the zero-signal guard (the warm-up already solves the training tasks); done" >&2
  exit 0
fi
exit "$status"
