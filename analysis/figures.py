"""matplotlib figures of one run (and of a sweep), rendered off-screen with the Agg canvas.

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot), so nothing touches a global backend or a
display. Each ``fig_*`` function returns None when the run has no data for it, so a report shows only what exists.
Inputs: ``steps`` is :func:`analysis.summary.step_summary` of the store (or None), ``metrics`` the frame of
:func:`analysis.loaders.load_metrics`.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.loaders import role_metrics
from analysis.summary import ALL_ENVS
from toolkit.run.metrics import STDERR_SUFFIX, is_eval_score

DPI = 100


def to_png(fig: Figure) -> bytes:
    """PNG bytes of ``fig`` (Agg canvas)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _new(nrows: int = 1, height: float = 3.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(8, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0].tolist()
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    return fig, axes


def _train(steps: pd.DataFrame | None) -> pd.DataFrame:
    if steps is None or steps.empty:
        return pd.DataFrame()
    return steps[steps["kind"] == "train"]


def _per_env(steps: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    envs = sorted(set(steps["env"]) - {ALL_ENVS})
    names = envs + [ALL_ENVS] if len(envs) > 1 else envs
    return [(e, steps[steps["env"] == e].sort_values("step")) for e in names]


def fig_reward(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Mean reward per env (valid rollouts) over steps (dashed: each seat of an env with several agent seats, from
    ``reward/<env>/seat/<seat>/mean``), and solve-none / solve-all shares of groups as bands from the bottom and
    the top."""
    tr = _train(steps)
    if tr.empty:
        orch = role_metrics(metrics, "orchestrator")
        if "reward/all/mean" not in orch.columns:
            return None
        fig, (ax,) = _new(1)
        ax.plot(orch.index, orch["reward/all/mean"], label="reward/all/mean")
        ax.set_ylabel("reward")
        ax.legend(loc="best", fontsize=8)
        fig.suptitle("Reward (from metrics.jsonl)")
        return fig
    fig, (ax, ax2) = _new(2)
    for env, d in _per_env(tr):
        ax.plot(d["step"], d["reward_mean"], marker=".", label=env)
    # The seats of a multi-seat env (the players of a game) from the orchestrator's per-seat metrics.
    orch = role_metrics(metrics, "orchestrator")
    for col in sorted(c for c in orch.columns if c.startswith("reward/") and "/seat/" in c and c.endswith("/mean")):
        env, seat = col[len("reward/") : -len("/mean")].split("/seat/", 1)
        d = orch[col].astype(float).dropna()
        ax.plot(d.index, d.values, ls="--", label=f"{env}, seat {seat}")
    ax.set_ylabel("reward (mean of valid)")
    ax.legend(loc="best", fontsize=8)
    d = tr[tr["env"] == ALL_ENVS].sort_values("step")
    ax2.fill_between(d["step"], 0, d["solve_none"], color="tab:red", alpha=0.5, label="solve-none groups")
    ax2.fill_between(d["step"], 1 - d["solve_all"], 1, color="tab:green", alpha=0.5, label="solve-all groups")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("share of groups")
    ax2.legend(loc="center right", fontsize=8)
    fig.suptitle("Reward and solve-none / solve-all groups (train)")
    return fig


def fig_batch(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Rollouts per step and effective batch size (valid rollouts in groups with reward spread)."""
    tr = _train(steps)
    orch = role_metrics(metrics, "orchestrator")
    if tr.empty and "effective_batch_size" not in orch.columns:
        return None
    fig, (ax,) = _new(1)
    if not tr.empty:
        d = tr[tr["env"] == ALL_ENVS].sort_values("step")
        ax.plot(d["step"], d["rollouts"], marker=".", label="rollouts stored")
        ax.plot(d["step"], d["effective_batch_size"], marker=".", label="effective batch size (store)")
    if "effective_batch_size" in orch.columns:
        ax.plot(orch.index, orch["effective_batch_size"], ls="--", label="effective_batch_size (orchestrator)")
    ax.set_ylabel("rollouts")
    ax.legend(loc="best", fontsize=8)
    fig.suptitle("Effective batch size")
    return fig


def fig_errors(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Errored and truncated shares of rollouts per env and step."""
    tr = _train(steps)
    if tr.empty:
        return None
    fig, (ax, ax2) = _new(2)
    for env, d in _per_env(tr):
        ax.plot(d["step"], d["errored_rate"], marker=".", label=env)
        if "truncated_rate" in d.columns:
            ax2.plot(d["step"], d["truncated_rate"], marker=".", label=env)
    ax.set_ylabel("errored share")
    ax2.set_ylabel("truncated share")
    for a in (ax, ax2):
        a.set_ylim(-0.02, 1.02)
        a.legend(loc="best", fontsize=8)
    fig.suptitle("Errored and truncated rollouts (train)")
    return fig


def fig_lengths(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Mean prompt and completion length (tokens) and mean turns per rollout."""
    tr = _train(steps)
    if tr.empty or "completion_len_mean" not in tr.columns:
        return None
    fig, (ax, ax2) = _new(2)
    for env, d in _per_env(tr):
        line = ax.plot(d["step"], d["completion_len_mean"], marker=".", label=f"{env} completion")[0]
        ax.plot(d["step"], d["prompt_len_mean"], ls=":", color=line.get_color(), label=f"{env} prompt")
        ax2.plot(d["step"], d["num_turns_mean"], marker=".", label=env)
    ax.set_ylabel("tokens (mean)")
    ax2.set_ylabel("turns (mean)")
    ax.legend(loc="best", fontsize=8)
    ax2.legend(loc="best", fontsize=8)
    fig.suptitle("Lengths and turns (train)")
    return fig


def fig_off_policy(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Off-policy age (steps between the policy that sampled a rollout and the step it trains): mean and max."""
    tr = _train(steps)
    orch = role_metrics(metrics, "orchestrator")
    if (tr.empty or "off_policy_age_mean" not in tr.columns) and "off_policy/mean" not in orch.columns:
        return None
    fig, (ax,) = _new(1)
    if not tr.empty and "off_policy_age_mean" in tr.columns:
        d = tr[tr["env"] == ALL_ENVS].sort_values("step")
        ax.plot(d["step"], d["off_policy_age_mean"], marker=".", label="mean (store)")
        ax.plot(d["step"], d["off_policy_age_max"], marker=".", label="max (store)")
    for col in ("off_policy/mean", "off_policy/max", "off_policy/dropped"):
        if col in orch.columns:
            ax.plot(orch.index, orch[col], ls="--", label=col)
    ax.set_ylabel("steps")
    ax.legend(loc="best", fontsize=8)
    fig.suptitle("Off-policy age")
    return fig


def _metric_fig(
    metrics: pd.DataFrame, role: str, cols: list[str], title: str, ylabel: str, logy: bool = False
) -> Figure | None:
    data = role_metrics(metrics, role)
    present = [c for c in cols if c in data.columns]
    if not present:
        return None
    fig, (ax,) = _new(1)
    for c in present:
        ax.plot(data.index, data[c].astype(float), marker=".", label=c)
    if logy and (data[present].astype(float) > 0).all().all():
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.legend(loc="best", fontsize=8)
    fig.suptitle(title)
    return fig


def fig_mismatch_kl(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Trainer/inference mismatch KL (mean, max) and the masked token share."""
    return _metric_fig(
        metrics,
        "trainer",
        ["mismatch_kl/mean", "mismatch_kl/max", "is_masked/mean"],
        "Mismatch KL between trainer and inference",
        "KL (nats) / share",
    )


def fig_distillation(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """On-policy distillation (``opd`` envs): the teacher-student KL per env at sampling time
    (``teacher/<env>/kl``) and the trainer's reverse-KL term (``ref_kl/mean``) beside the env's mean reward, and
    the teacher's mean latency per scoring request. None for a run without a teacher."""
    orch = role_metrics(metrics, "orchestrator")
    tr = role_metrics(metrics, "trainer")
    kl_cols = sorted(c for c in orch.columns if c.startswith("teacher/") and c.endswith("/kl"))
    if not kl_cols:
        return None
    fig, (ax, ax2) = _new(2)
    for c in kl_cols:
        ax.plot(orch.index, orch[c].astype(float), marker=".", label=c)
    if "ref_kl/mean" in tr.columns:
        ax.plot(tr.index, tr["ref_kl/mean"].astype(float), marker=".", ls="--", label="ref_kl/mean (trainer)")
    ax.set_ylabel("KL estimate (nats/token)")
    ax.legend(loc="upper left", fontsize=8)
    rewards = [f"reward/{c.split('/')[1]}/mean" for c in kl_cols if f"reward/{c.split('/')[1]}/mean" in orch]
    if rewards:
        twin = ax.twinx()
        for c in rewards:
            twin.plot(orch.index, orch[c].astype(float), color="tab:green", alpha=0.6, label=c)
        twin.set_ylabel("reward")
        twin.legend(loc="upper right", fontsize=8)
    for c in sorted(c for c in orch.columns if c.startswith("teacher/") and c.endswith("/latency_s")):
        ax2.plot(orch.index, orch[c].astype(float), marker=".", label=c)
    ax2.set_ylabel("seconds per request")
    ax2.legend(loc="best", fontsize=8)
    fig.suptitle("Distillation: teacher-student KL, reward and teacher latency")
    return fig


def fig_inference_replicas(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Elastic inference (``[deployment.elastic]``): replica engines serving the run per step beside the mean
    reward, and the rollouts per second with the requests the policy client had to send again. None for a run
    without elastic replicas."""
    orch = role_metrics(metrics, "orchestrator")
    if "inference/replicas" not in orch.columns:
        return None
    fig, (ax, ax2) = _new(2)
    ax.step(orch.index, orch["inference/replicas"].astype(float), where="post", label="inference/replicas")
    ax.set_ylabel("replica engines")
    ax.legend(loc="upper left", fontsize=8)
    if "reward/all/mean" in orch.columns:
        twin = ax.twinx()
        twin.plot(orch.index, orch["reward/all/mean"].astype(float), color="tab:green", alpha=0.6, label="reward")
        twin.set_ylabel("reward")
        twin.legend(loc="upper right", fontsize=8)
    if {"effective_batch_size", "time/step"} <= set(orch.columns):
        rate = orch["effective_batch_size"].astype(float) / orch["time/step"].astype(float).clip(lower=1e-9)
        ax2.plot(orch.index, rate, marker=".", label="rollouts/s")
    if "inference/retried_requests" in orch.columns:
        ax2.plot(orch.index, orch["inference/retried_requests"].astype(float), ls="--", label="retried requests")
    if "inference/lost_requests" in orch.columns:
        lost = orch["inference/lost_requests"].astype(float).diff().fillna(0.0)
        ax2.plot(orch.index, lost, ls=":", label="requests held by leaving replicas")
    ax2.set_ylabel("per second / per step")
    ax2.legend(loc="best", fontsize=8)
    fig.suptitle("Elastic inference: replicas, reward, rollout rate, lost and retried requests")
    return fig


def fig_entropy(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Policy entropy, loss and gradient norm."""
    return _metric_fig(
        metrics,
        "trainer",
        ["entropy/mean", "loss/mean", "optim/grad_norm"],
        "Entropy, loss and gradient norm",
        "value",
    )


def fig_throughput(steps: pd.DataFrame | None, metrics: pd.DataFrame) -> Figure | None:
    """Trainer throughput (tokens/s) and step / wait times (seconds) of trainer and orchestrator."""
    tr = role_metrics(metrics, "trainer")
    orch = role_metrics(metrics, "orchestrator")
    waits = [
        (tr, c, f"trainer {c}")
        for c in ("time/step", "time/wait_for_batch", "time/save_ckpt", "time/broadcast")
        if c in tr.columns
    ]
    waits += [(orch, c, f"orchestrator {c}") for c in ("time/step", "time/wait_for_policy") if c in orch.columns]
    has_tp = "perf/throughput" in tr.columns
    if not waits and not has_tp:
        return None
    fig, axes = _new(2 if has_tp and waits else 1)
    i = 0
    if has_tp:
        axes[0].plot(tr.index, tr["perf/throughput"], marker=".", label="perf/throughput")
        axes[0].set_ylabel("tokens/s")
        axes[0].legend(loc="best", fontsize=8)
        i = 1
    if waits:
        ax = axes[i]
        for frame, col, label in waits:
            ax.plot(frame.index, frame[col], marker=".", label=label)
        ax.set_ylabel("seconds")
        ax.legend(loc="best", fontsize=8)
    fig.suptitle("Throughput and wait times")
    return fig


def eval_scores(metrics: pd.DataFrame) -> list[str]:
    """The orchestrator's held-out eval score columns of ``metrics`` (``eval/<env>/avg@k``, ``pass@k``; see
    :func:`toolkit.run.metrics.is_eval_score`), sorted; their ``/stderr`` and the eval's bookkeeping left out."""
    return sorted(c for c in role_metrics(metrics, "orchestrator").columns if is_eval_score(c))


def fig_eval(
    steps: pd.DataFrame | None, metrics: pd.DataFrame, *, before: tuple[str, pd.DataFrame] | None = None
) -> Figure | None:
    """Periodic eval scores (``eval/<env>/avg@k``, ``pass@k``) over steps, each point with an error bar of one
    standard error where the run recorded it (step 0 is the baseline). Bookkeeping (policy version, examples,
    errored) is not drawn.

    ``before``: (label, metrics) of the run this one started from (the SFT run of an SFT -> RL chain). Its evals
    are drawn first, and this run's steps are shifted by that run's last step, so both lie on one time line with
    a dashed line where this run starts.
    """
    runs = [(label, m) for label, m in ([before] if before else []) if eval_scores(m)]
    if not eval_scores(metrics):
        return None
    runs.append(("", metrics))
    fig, (ax,) = _new(1)
    offset = 0
    colors: dict[str, str] = {}
    with_errors = False
    for i, (label, m) in enumerate(runs):
        orch = role_metrics(m, "orchestrator")
        for c in eval_scores(m):
            d = orch[c].astype(float).dropna()
            err = orch[c + STDERR_SUFFIX].reindex(d.index).astype(float) if c + STDERR_SUFFIX in orch else None
            with_errors = with_errors or (err is not None and err.notna().any())
            name = f"{c} ({label})" if label else c
            bars = ax.errorbar(
                d.index + offset,
                d.values,
                yerr=None if err is None else err.fillna(0).values,
                marker="o" if not label else "s",
                ls="-" if not label else ":",
                capsize=3,
                color=colors.get(c),
                label=name,
            )
            colors.setdefault(c, bars.lines[0].get_color())
        if label and i + 1 < len(runs):
            trainer = role_metrics(m, "trainer")
            offset = int(max([*orch.index, *trainer.index], default=0))
            ax.axvline(offset, color="gray", ls="--", lw=1)
            ax.annotate(
                f"{label} ends",
                (offset, 0),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
                color="gray",
                xycoords=("data", "axes fraction"),
            )
    ax.set_ylabel("score (bars: ± 1 standard error)" if with_errors else "score")
    ax.set_xlabel("step" if not before or len(runs) == 1 else f"step ({runs[0][0]} steps, then this run's)")
    ax.legend(loc="best", fontsize=8)
    fig.suptitle("Held-out eval")
    return fig


RUN_FIGURES: dict[str, Callable[[pd.DataFrame | None, pd.DataFrame], Figure | None]] = {
    "reward": fig_reward,
    "effective_batch_size": fig_batch,
    "errors_truncation": fig_errors,
    "lengths_turns": fig_lengths,
    "off_policy_age": fig_off_policy,
    "mismatch_kl": fig_mismatch_kl,
    "distillation": fig_distillation,
    "inference_replicas": fig_inference_replicas,
    "entropy_loss_grad": fig_entropy,
    "throughput_waits": fig_throughput,
    "eval": fig_eval,
}


def fig_sweep(curves: pd.DataFrame, finals: pd.DataFrame, metric: str) -> Figure | None:
    """Sweep comparison: ``metric`` over steps per point (mean across seeds, band = min..max), and the final value
    per point with its 95% t-interval.

    ``curves``: columns point, step, value (one row per seed and step). ``finals``: columns point, mean, low, high.
    """
    if curves.empty:
        return None
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    for point, d in curves.groupby("point", sort=True):
        agg = d.groupby("step")["value"].agg(["mean", "min", "max"])
        line = ax.plot(agg.index, agg["mean"], marker=".", label=str(point))[0]
        ax.fill_between(agg.index, agg["min"], agg["max"], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    x = np.arange(len(finals))
    means = finals["mean"].to_numpy(dtype=float)
    low = np.nan_to_num(means - finals["low"].to_numpy(dtype=float))
    high = np.nan_to_num(finals["high"].to_numpy(dtype=float) - means)
    ax2.bar(x, means, yerr=[low, high], capsize=4, color="tab:blue", alpha=0.7)
    ax2.set_xticks(x, [str(p) for p in finals["point"]], rotation=30, ha="right", fontsize=7)
    ax2.set_ylabel(f"final {metric} (95% CI)")
    ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Sweep: {metric}")
    return fig
