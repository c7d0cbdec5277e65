#!/usr/bin/env bash
# The reverse-text recipe on CPU: SFT warm-up on reference answers, then RL from the SFT model.
#   jobs/reverse-text/sft-then-rl.sh [OVERLAY.toml ...]
# 1. writes data/reverse-text-sft.jsonl (8000 reference rows of the RL job's own train split and prompts; kept);
# 2. `srl sft chain` runs SFT (jobs/reverse-text/sft.toml, online eval on the held-out split), then RL
#    (jobs/reverse-text/rl.toml + rl-after-sft.toml) starting from the SFT run's final model.
# On a Slurm site add the overlay after each config, e.g. for the local test cluster:
#   jobs/reverse-text/sft-then-rl.sh @ jobs/reverse-text/slurm.toml
# (the chain then submits the SFT job and the RL job behind it with --dependency=afterok).
set -euo pipefail
cd "$(dirname "$0")/../.."
srl=${SRL:-.venv/bin/srl}
data=data/reverse-text-sft.jsonl
if [ ! -s "$data" ]; then
  "$srl" sft make-data "$data" @ jobs/reverse-text/rl.toml --taskset.num-train-examples 8000
fi
# Overlays (site, deployment) apply to both runs; anything else is refused rather than applied to one of them.
overlays=()
for a in "$@"; do
  case $a in
    @) ;;
    *.toml) overlays+=("@" "$a") ;;
    *) echo "usage: $0 [OVERLAY.toml ...] (got '$a'; run srl sft chain yourself for other options)" >&2; exit 2 ;;
  esac
done
status=0
"$srl" sft chain @ jobs/reverse-text/sft.toml "${overlays[@]}" \
  --then @ jobs/reverse-text/rl.toml @ jobs/reverse-text/rl-after-sft.toml "${overlays[@]}" || status=$?
# Exit status 4: the RL run stopped on the zero-signal guard. After a warm-up that solves every training task that
# is this recipe's expected end (RL has nothing left to learn from), so the recipe counts it as done; any other
# non-zero status (a failed role, another stop criterion, Ctrl-C) is passed on.
if [ "$status" -eq 4 ]; then
  echo "sft-then-rl: RL stopped on the zero-signal guard (the warm-up already solves the training tasks); done" >&2
  exit 0
fi
exit "$status"
