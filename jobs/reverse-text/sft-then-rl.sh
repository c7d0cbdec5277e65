#!/usr/bin/env bash
# The reverse-text recipe on CPU: SFT warm-up on 8000 reference answers, then RL from the SFT model
# (jobs/sft-then-rl.sh says how).
#   jobs/reverse-text/sft-then-rl.sh [OVERLAY.toml ...]
# On a Slurm site add the overlay, e.g. for the local test cluster:
#   jobs/reverse-text/sft-then-rl.sh @ jobs/reverse-text/slurm.toml
set -euo pipefail
exec "$(dirname "$0")/../sft-then-rl.sh" jobs/reverse-text 8000 "$@"
