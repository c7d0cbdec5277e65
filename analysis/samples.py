"""Sample rollouts for a report: per (kind, env), the best, the worst and a truncated rollout of its newest step,
decoded to text, and the truncated shares that say whether rewards are of cut-off replies.

Tokens come from the rollout store (:func:`toolkit.run.store.load_samples`, a few rows only); text from the model's
``tokenizer.json`` through the ``tokenizers`` library (no torch, no transformers), found without building anything
(:func:`toolkit.models.resolve.local_model_dir`). Without a tokenizer the token ids are shown instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from toolkit.models.resolve import local_model_dir
from toolkit.run.store import load_samples

# Characters of a prompt or completion shown at most (the tail of a prompt, the head of a completion).
MAX_CHARS = 600
# Share of a step's rollouts cut by a length limit from which a report calls the rewards those of cut-off replies.
TRUNCATED_HIGH = 0.5


def tokenizer_dir(model_name: str | None) -> Path | None:
    """Directory holding the ``tokenizer.json`` of ``model_name`` (a model directory, an alias built before, or an
    srl SFT run directory, whose ``model/`` is its final model); None when none is found. Never builds a model."""
    if not model_name:
        return None
    base = local_model_dir(str(model_name))
    if base is None:
        return None
    for d in (base, base / "model"):
        if (d / "tokenizer.json").is_file():
            return d
    return None


def decoder(model_name: str | None) -> Callable[[list[int]], str] | None:
    """A function from token ids to text (special tokens kept: they are part of what the policy emitted), or None
    when the model's tokenizer cannot be found or loaded."""
    d = tokenizer_dir(model_name)
    if d is None:
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - a report shows ids rather than fail on a tokenizer it cannot read
        return None
    return lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False)


def pick_samples(rollouts: pd.DataFrame) -> pd.DataFrame:
    """Which rollouts to show: per (kind, env), at its newest step, the valid rollout with the highest reward
    (``best``), the one with the lowest (``worst``) and the first truncated one (``truncated``, when any).

    ``rollouts`` is the store's frame (index = row position in the store). Returns columns ``row``, ``kind``,
    ``env``, ``which``, ``step``, ``reward``, ``truncated``, ``truncation_reason``, ``completion_len``; empty when
    nothing is valid.
    """
    cols = ["row", "kind", "env", "which", "step", "reward", "truncated", "truncation_reason", "completion_len"]
    if rollouts is None or rollouts.empty:
        return pd.DataFrame(columns=cols)
    df = rollouts.assign(kind=rollouts["kind"].astype(str), env=rollouts["env"].astype(str))
    if "error_class" in df.columns:
        df = df[df["error_class"].isna()]
    picks: list[dict[str, Any]] = []
    for (kind, env), d in df.groupby(["kind", "env"], sort=True):
        last = d[d["step"] == d["step"].max()]
        chosen = [("best", last["reward"].idxmax()), ("worst", last["reward"].idxmin())]
        if "truncated" in last.columns and last["truncated"].astype(bool).any():
            chosen.append(("truncated", last.index[last["truncated"].astype(bool).to_numpy()][0]))
        for which, row in chosen:
            r = last.loc[row]
            picks.append(
                {
                    "row": int(row),
                    "kind": kind,
                    "env": env,
                    "which": which,
                    "step": int(r["step"]),
                    "reward": float(r["reward"]),
                    "truncated": bool(r.get("truncated", False)),
                    "truncation_reason": None if pd.isna(r.get("truncation_reason")) else str(r["truncation_reason"]),
                    "completion_len": int(r["completion_len"]) if "completion_len" in r else None,
                }
            )
    return pd.DataFrame(picks, columns=cols)


def sample_texts(store: Path, picks: pd.DataFrame, model_name: str | None) -> pd.DataFrame:
    """``picks`` (:func:`pick_samples`) with ``prompt`` and ``completion`` text columns: the prompt's last
    ``MAX_CHARS`` characters and the completion's first (every sample of a rollout, joined), decoded with the
    model's tokenizer, else as token ids. Rows whose tokens cannot be read keep empty text."""
    if picks.empty:
        return picks.assign(prompt=[], completion=[])
    decode = decoder(model_name) or (lambda ids: "token ids: " + " ".join(str(int(i)) for i in ids))
    try:
        samples = load_samples(store, picks["row"].tolist())
    except (OSError, KeyError, ValueError):
        samples = {}
    prompts, completions = [], []
    for row in picks["row"]:
        parts = samples.get(int(row), [])
        prompt = decode(parts[0][0]) if parts else ""
        completion = "".join(decode(c) for _, c, _ in parts)
        prompts.append(prompt if len(prompt) <= MAX_CHARS else "..." + prompt[-MAX_CHARS:])
        completions.append(completion if len(completion) <= MAX_CHARS else completion[:MAX_CHARS] + "...")
    return picks.assign(prompt=prompts, completion=completions)


def truncation(rollouts: pd.DataFrame | None) -> pd.DataFrame:
    """Truncated share of valid and errored rollouts per (kind, env): over the whole run and at its newest step,
    with the most common ``truncation_reason``. Columns ``kind``, ``env``, ``rollouts``, ``truncated_share``,
    ``last_step``, ``last_step_share``, ``reason``; empty without a ``truncated`` column."""
    cols = ["kind", "env", "rollouts", "truncated_share", "last_step", "last_step_share", "reason"]
    if rollouts is None or rollouts.empty or "truncated" not in rollouts.columns:
        return pd.DataFrame(columns=cols)
    df = rollouts.assign(
        kind=rollouts["kind"].astype(str), env=rollouts["env"].astype(str), truncated=rollouts["truncated"].astype(bool)
    )
    rows = []
    for (kind, env), d in df.groupby(["kind", "env"], sort=True):
        last = d[d["step"] == d["step"].max()]
        reasons = d.loc[d["truncated"], "truncation_reason"].dropna().astype(str) if "truncation_reason" in d else []
        rows.append(
            {
                "kind": kind,
                "env": env,
                "rollouts": len(d),
                "truncated_share": float(d["truncated"].mean()),
                "last_step": int(last["step"].iloc[0]),
                "last_step_share": float(last["truncated"].mean()),
                "reason": pd.Series(reasons).mode().iloc[0] if len(reasons) else "",
            }
        )
    return pd.DataFrame(rows, columns=cols)
