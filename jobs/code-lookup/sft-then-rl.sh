#!/usr/bin/env bash
# The tool-use recipe on CPU: SFT on 8000 known-good code-lookup episodes (tool call, result, answer), then RL from
# the SFT model (jobs/sft-then-rl.sh says how).
#   jobs/code-lookup/sft-then-rl.sh [OVERLAY.toml ...]
set -euo pipefail
exec "$(dirname "$0")/../sft-then-rl.sh" jobs/code-lookup 8000 "$@"
