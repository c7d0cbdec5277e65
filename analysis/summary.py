"""pandas summaries of the rollout store: per group, per (env, step), per env, and errors by class.

Definitions (what to monitor in an RL run):

- A rollout is *valid* when it has no error class; errored rollouts never count towards rewards (they never enter
  a training batch either).
- A group (``group_id`` within kind, env and step) is *solve-none* when every valid reward is <= ``low`` and
  *solve-all* when every valid reward is >= ``high`` (defaults 0 and 1, i.e. binary rewards); it *has signal* when
  its valid rewards are not all equal, since group-relative advantages are then not all zero.
- The *effective batch size* of a step is the number of valid rollouts in groups with signal: what online difficulty
  filtering would keep.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

GROUP_KEYS = ["kind", "env", "step", "group_id"]
STEP_KEYS = ["kind", "env", "step"]
ALL_ENVS = "all"


def _prepare(rollouts: pd.DataFrame) -> pd.DataFrame:
    df = rollouts
    if "kind" not in df.columns:
        df = df.assign(kind="train")
    valid = df["error_class"].isna().to_numpy() if "error_class" in df.columns else np.ones(len(df), bool)
    reward = df["reward"].to_numpy(dtype=np.float64)
    # Group on categorical codes (the store returns categoricals already): factorising a million strings per
    # groupby would dominate the summary's time.
    return df.assign(
        _valid=valid,
        _vreward=np.where(valid, reward, np.nan),
        _errored=~valid,
        kind=_categorical(df["kind"]),
        env=_categorical(df["env"]),
    )


def _categorical(col: pd.Series) -> pd.Series:
    return col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")


def _agg_with_all(df: pd.DataFrame, keys: list[str], **aggs: tuple[str, str]) -> pd.DataFrame:
    """``df.groupby(keys).agg(**aggs)`` plus rows with env ``"all"`` aggregated over every env (keys contain env)."""
    per_env = df.groupby(keys, observed=True, sort=True).agg(**aggs).reset_index()
    other = [k for k in keys if k != "env"]
    every = df.groupby(other, observed=True, sort=True).agg(**aggs).reset_index().assign(env=ALL_ENVS)
    out = pd.concat(
        [
            per_env.assign(env=per_env["env"].astype(str), kind=per_env["kind"].astype(str)),
            every.assign(kind=every["kind"].astype(str)),
        ],
        ignore_index=True,
    )
    return out[keys + list(aggs)].sort_values(keys, kind="stable").reset_index(drop=True)


def group_stats(rollouts: pd.DataFrame, *, low: float = 0.0, high: float = 1.0) -> pd.DataFrame:
    """One row per group: ``size``, ``valid``, reward ``mean``/``std``/``min``/``max`` over valid rollouts,
    ``solve_none``, ``solve_all`` and ``has_signal`` (see module docstring). Groups with no valid rollout have NaN
    rewards and all three flags False.
    """
    df = _prepare(rollouts)
    g = df.groupby(GROUP_KEYS, observed=True, sort=True)["_vreward"]
    out = g.agg(size="size", valid="count", mean="mean", std="std", min="min", max="max").reset_index()
    has_valid = out["valid"].to_numpy() > 0
    out["solve_none"] = has_valid & (out["max"].to_numpy() <= low)
    out["solve_all"] = has_valid & (out["min"].to_numpy() >= high)
    out["has_signal"] = has_valid & (out["max"].to_numpy() > out["min"].to_numpy())
    return out


def step_summary(
    rollouts: pd.DataFrame, *, low: float = 0.0, high: float = 1.0, groups: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (kind, env, step), plus env ``"all"`` rows aggregating every env of that kind and step.

    Columns: ``rollouts``, ``groups``, ``reward_mean``/``reward_std``/``reward_min``/``reward_max`` (valid rollouts),
    ``solve_none``/``solve_all`` (share of groups), ``effective_batch_size`` (rollouts), ``errored_rate``,
    ``truncated_rate`` (shares of all rollouts), ``prompt_len_mean``, ``completion_len_mean``,
    ``completion_len_max`` (tokens), ``num_turns_mean``, ``off_policy_age_mean``/``off_policy_age_max`` (steps).
    ``groups`` is :func:`group_stats` of the same rows when already computed. Returns an empty frame for an empty
    store.
    """
    if rollouts.empty:
        return pd.DataFrame(columns=[*STEP_KEYS, "rollouts"])
    df = _prepare(rollouts)
    if groups is None:
        groups = group_stats(rollouts, low=low, high=high)
    aggs: dict[str, tuple[str, str]] = {
        "rollouts": ("_valid", "size"),
        "reward_mean": ("_vreward", "mean"),
        "reward_std": ("_vreward", "std"),
        "reward_min": ("_vreward", "min"),
        "reward_max": ("_vreward", "max"),
        "errored_rate": ("_errored", "mean"),
    }
    optional = {
        "truncated_rate": ("truncated", "mean"),
        "prompt_len_mean": ("prompt_len", "mean"),
        "completion_len_mean": ("completion_len", "mean"),
        "completion_len_max": ("completion_len", "max"),
        "num_turns_mean": ("num_turns", "mean"),
        "off_policy_age_mean": ("off_policy_age", "mean"),
        "off_policy_age_max": ("off_policy_age", "max"),
    }
    aggs.update({k: v for k, v in optional.items() if v[0] in df.columns})
    out = _agg_with_all(df, STEP_KEYS, **aggs)
    groups = groups.assign(_eff=np.where(groups["has_signal"], groups["valid"], 0))
    gsum = _agg_with_all(
        groups,
        STEP_KEYS,
        groups=("size", "size"),
        solve_none=("solve_none", "mean"),
        solve_all=("solve_all", "mean"),
        effective_batch_size=("_eff", "sum"),
    )
    out = out.merge(gsum, on=STEP_KEYS, how="left")
    if "truncated_rate" in out.columns:
        out["truncated_rate"] = out["truncated_rate"].astype(float)
    return out


def env_summary(
    rollouts: pd.DataFrame, *, low: float = 0.0, high: float = 1.0, groups: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (kind, env) over the whole run: ``rollouts``, ``steps``, reward mean/std over valid rollouts,
    group ``solve_none``/``solve_all``/``has_signal`` shares, ``errored_rate``, ``truncated_rate``, mean lengths
    (tokens) and turns, and the ``first_step``/``last_step`` seen. ``groups`` as in :func:`step_summary`.
    """
    if rollouts.empty:
        return pd.DataFrame(columns=["kind", "env", "rollouts"])
    df = _prepare(rollouts)
    if groups is None:
        groups = group_stats(rollouts, low=low, high=high)
    aggs: dict[str, tuple[str, str]] = {
        "rollouts": ("_valid", "size"),
        "steps": ("step", "nunique"),
        "first_step": ("step", "min"),
        "last_step": ("step", "max"),
        "reward_mean": ("_vreward", "mean"),
        "reward_std": ("_vreward", "std"),
        "errored_rate": ("_errored", "mean"),
    }
    for name, col in (
        ("truncated_rate", "truncated"),
        ("completion_len_mean", "completion_len"),
        ("prompt_len_mean", "prompt_len"),
        ("num_turns_mean", "num_turns"),
    ):
        if col in df.columns:
            aggs[name] = (col, "mean")
    out = df.groupby(["kind", "env"], observed=True, sort=True).agg(**aggs)
    gsum = groups.groupby(["kind", "env"], observed=True, sort=True).agg(
        groups=("size", "size"),
        solve_none=("solve_none", "mean"),
        solve_all=("solve_all", "mean"),
        has_signal=("has_signal", "mean"),
    )
    out = out.join(gsum).reset_index()
    out["kind"], out["env"] = out["kind"].astype(str), out["env"].astype(str)
    out = out.sort_values(["kind", "env"], kind="stable").reset_index(drop=True)
    if "truncated_rate" in out.columns:
        out["truncated_rate"] = out["truncated_rate"].astype(float)
    return out


def error_counts(rollouts: pd.DataFrame) -> pd.DataFrame:
    """Errored rollouts per (kind, env, error_class): ``count``, ``first_step``, ``last_step`` and, when the store
    column is loaded, the ``first_message``. Empty frame when nothing errored."""
    cols = ["kind", "env", "error_class", "count", "first_step", "last_step", "first_message"]
    if rollouts.empty or "error_class" not in rollouts.columns:
        return pd.DataFrame(columns=cols)
    df = _prepare(rollouts)
    err = df[df["_errored"]]
    err = err.assign(
        kind=err["kind"].astype(str), env=err["env"].astype(str), error_class=err["error_class"].astype(str)
    )
    if err.empty:
        return pd.DataFrame(columns=cols)
    if "error_message" not in err.columns:
        err = err.assign(error_message=None)
    out = (
        err.groupby(["kind", "env", "error_class"], sort=True)
        .agg(
            count=("step", "size"),
            first_step=("step", "min"),
            last_step=("step", "max"),
            first_message=("error_message", "first"),
        )
        .reset_index()
    )
    return out[cols]


def t_interval(values: np.ndarray | pd.Series, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval ``(mean, low, high)`` of independent samples (e.g. one
    final metric per seed). Source: the t-interval mean +/- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample standard
    deviation (ddof=1). With one sample the interval is (mean, nan, nan); NaNs are ignored.
    """
    x = np.asarray(values, dtype=np.float64)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return (float("nan"), float("nan"), float("nan"))
    mean = float(x.mean())
    if n == 1:
        return (mean, float("nan"), float("nan"))
    half = student_t_ppf((1 + confidence) / 2, n - 1) * float(x.std(ddof=1)) / np.sqrt(n)
    return (mean, mean - half, mean + half)


def student_t_ppf(q: float, df: int) -> float:
    """Quantile ``q`` (0.5 < q < 1) of Student's t with ``df`` degrees of freedom, by bisection on the CDF.

    The CDF uses the regularised incomplete beta function I_x(df/2, 1/2) with x = df / (df + t^2) (Abramowitz &
    Stegun 26.7.1), evaluated by Lentz's continued fraction (Numerical Recipes, 3rd ed., 6.4). Kept here so reports
    need no scipy; exact to ~1e-10 (t_{0.975, 2} = 4.302653).
    """
    if not 0.5 < q < 1:
        raise ValueError(f"quantile {q} must be in (0.5, 1)")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < q:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def _t_cdf(t: float, df: int) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1 - tail if t >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    from math import exp, lgamma, log

    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log(1 - x))
    if x > (a + 1) / (a + b + 2):  # the continued fraction converges fast only on this side; use symmetry
        return 1.0 - _betainc(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f / a
