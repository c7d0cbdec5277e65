"""Failure diagnosis: classify what went wrong in a run into failure boundaries, with evidence and advice.

The seed ("train-with-environments", Failure diagnosis) asks to classify before touching hyperparameters:
valid low reward; ProviderError; HarnessError; ToolsetError/UserError; SandboxError/TunnelError; TaskError; trainer
instability. srl adds RewardSkippedError (a reward left unscored, which would read as 0), all-zero (and all-one)
groups, and Slurm-level causes read from the job's log text.

Sources read, all through ``RunDir``: the rollout store's ``error_class``/``reward`` columns, ``metrics.jsonl``
(trainer stability), and every text file under ``<run>/logs/`` and ``<run>/launcher/`` (error class names in role
logs; slurmstepd's ``DUE TO TIME LIMIT``, ``oom-kill``, ``NODE_FAIL``, ``PREEMPT``, ``CANCELLED`` lines), and a
local run's ``launcher/local.json`` (its exit status, with the first error line of that attempt's role logs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.loaders import dotted, load_metrics, read_json, read_store, require_run_dir, role_metrics
from analysis.summary import group_stats
from toolkit.config.model import off_policy_bound
from toolkit.run import ending
from toolkit.run.launcher import read_local_record
from toolkit.run.layout import RunDir

# Boundary of each recorded error class (toolset goes with user, sandbox with tunnel: each pair fails at one boundary).
CLASS_BOUNDARY = {
    "ProviderError": "ProviderError",
    "HarnessError": "HarnessError",
    "ToolsetError": "ToolsetError/UserError",
    "UserError": "ToolsetError/UserError",
    "SandboxError": "SandboxError/TunnelError",
    "TunnelError": "SandboxError/TunnelError",
    "TaskError": "TaskError",
    "RewardSkippedError": "RewardSkippedError",
}

_NOT_HYPERPARAMS = "Learning-rate or other optimizer changes do not fix invalid traces."
ADVICE = {
    "ProviderError": "The inference endpoint, model, capacity or request dialect failed. Check the inference and "
    "router logs and the served model name. Retries with backoff help a transient outage; a wrong model name or "
    "an unsupported request field fails every time. " + _NOT_HYPERPARAMS,
    "HarnessError": "The harness program failed to install, launch, or exited non-zero. This is deterministic: "
    "retries do not fix it. Reproduce with `srl eval run` on one example and fix the harness. " + _NOT_HYPERPARAMS,
    "ToolsetError/UserError": "A tool server or the simulated-user server failed at start-up, was unreachable from "
    "the env workers, or misbehaved on a call. Check its placement, reachability and isolation. " + _NOT_HYPERPARAMS,
    "SandboxError/TunnelError": "The runtime (sandbox capacity, lifecycle, filesystem, network, rate limits) or the "
    "interception tunnel failed. Retries may help transient failures; otherwise cap pool workers and sandbox "
    "creation rate, use multiplex to bound tunnel count, and set explicit stage timeouts. " + _NOT_HYPERPARAMS,
    "TaskError": "Task setup, finalize or scoring code raised during rollouts. This is deterministic: retries do "
    "not fix it. Fix the taskset and pass `srl eval validate` (model-free) before training again. " + _NOT_HYPERPARAMS,
    "RewardSkippedError": "Scoring finished but left a reward or metric unscored: verifiers skips a signal that "
    "needs a runtime when none is handed to Task.score, so the reward would have read as a silent 0 and training "
    "would have followed a constant. Check that every reward's `runtime` parameter gets one (harness.runtime) and "
    "that `srl eval validate` passes. " + _NOT_HYPERPARAMS,
    "valid low reward": "Rollouts are valid but reward is low: the task is too hard for this model, or the "
    "prompt/tool contract or rubric does not match. Inspect samples and the step-0 baseline eval; check the "
    "verifier gives the intended reward on known successes before changing the trainer.",
    "all-zero groups": "Most groups have every rollout at zero reward, so group-relative advantages are zero and "
    "there is no gradient signal. Fix difficulty, model fit or environment behaviour before increasing optimizer "
    "effort (learning rate, steps, group size).",
    "all-one groups": "Most groups are solved by every rollout: no signal. Increase difficulty or sample a harder "
    "task distribution.",
    "env starved by the off-policy bound": "This env's groups take longer than the trainer's steps, so most of them "
    "are older than the off-policy bound when they finish and are dropped: the env trains on few batches whatever "
    "its ratio says. Raise orchestrator.max_async_level (and max_off_policy_steps, if set) so its groups stay "
    "within the bound, give it a smaller group_size so its groups finish sooner, or make its episodes faster "
    "(harness start-up, tool servers, max_turns).",
    "distillation collapsed to short replies": "The policy matched its reference by replying less, not better: "
    "an empty or very short reply is where the two agree, so the KL fell to about 0 and the training signal with "
    "it. With opsd the policy shown the demonstration must be able to use it (a weak model, or one that never saw "
    "a system message, prefers to stop when shown one): read that policy's own eval before training, or use opd "
    "with a teacher that solves the task. With opd check the teacher's own eval and that teacher.name is the model "
    "meant. A lower learning rate only slows the same collapse.",
    "stopped by a stop criterion": "srl ended the run itself on a stop criterion, not on a failure: the zero-signal "
    "guard (no group with differing rewards for that many steps: the task is too easy or too hard for the model "
    "now; after a warm-up that solves it, the expected end), or a divergence criterion. The other findings say "
    "why; change the task, the model or the criterion's settings (monitors.stop) before resuming.",
    "trainer instability": "Valid rollouts arrive but the trainer misbehaves. Lower the learning rate, tighten the "
    "off-policy bound (max_async_level), and check trainer/inference mismatch (dtype, renderer, weight reload) "
    "when mismatch KL grows. This is not an environment failure.",
    "Slurm: time limit": "The job hit its Slurm time limit. Resume from the last complete checkpoint (`--resume`), "
    "raise `slurm.time`, or set `signal_lead_s` so the run checkpoints before the limit.",
    "Slurm: out of memory": "The kernel OOM killer or Slurm's memory limit ended a job step. Lower rollout pressure "
    "(max_concurrent, pool.max_workers) and sequence lengths, or request more memory per node.",
    "GPU out of memory": "A CUDA allocation failed. Lower trainer micro_batch_size or seq_len, or vLLM's "
    "gpu_memory_utilization / max_num_seqs, before widening the job.",
    "Slurm: node failure": "A node failed under the job. Requeue (srl resumes from the last complete checkpoint) "
    "and exclude the node if it recurs.",
    "Slurm: preemption": "A higher-priority job preempted this one. Submit with requeue enabled; srl resumes from "
    "the last complete checkpoint.",
    "Slurm: cancelled": "The job was cancelled (scancel by a user or administrator). Check who cancelled it before "
    "resubmitting.",
    "Slurm: component failed": "A component of the job (named in the excerpt) exited with an error first, so srl "
    "stopped the others. Read its log (`srl logs RUN --role <role>`) for the traceback; other findings here name "
    "a cause when one was recognised. Resume from the last complete checkpoint once it is fixed.",
    "local: launcher failed": "The local run ended with a non-zero status: a component (its log is named in the "
    "excerpt) exited with an error, so srl stopped the others. Fix what the excerpt says (a data or config error "
    "fails the same way again), then rerun; `--resume` continues from the last complete checkpoint.",
    "unreadable run file": "A file of the run exists but cannot be read (the rollout store torn by a full disk or a "
    "killed writer, or overwritten), so the findings that need it are missing. Check the filesystem's free space "
    "and the orchestrator log around the run's end; the metrics and logs are read regardless.",
}

ERROR_CLASS_RE = re.compile(r"\b(" + "|".join(CLASS_BOUNDARY) + r")\b")
# Slurm-level patterns, checked in this order on each line (a line with "CANCELLED ... DUE TO TIME LIMIT" is a
# timeout, not a cancel). slurmstepd writes "*** JOB 12 ON n1 CANCELLED AT <time> DUE TO TIME LIMIT ***".
SLURM_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("Slurm: time limit", re.compile(r"DUE TO TIME LIMIT|State=TIMEOUT")),
    (
        "Slurm: out of memory",
        re.compile(r"oom[-_]kill|OUT_OF_MEMORY|Out of memory: Killed process", re.IGNORECASE),
    ),
    ("GPU out of memory", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA")),
    ("Slurm: node failure", re.compile(r"NODE_FAIL|DUE TO NODE FAILURE")),
    ("Slurm: preemption", re.compile(r"PREEMPTED|DUE TO PREEMPTION|State=PREEMPT")),
    # "... CANCELLED AT <time> DUE TO JOB REQUEUE ***" is a requeue (srl's own on the pre-timeout signal, or Slurm's),
    # not a cancel: the job runs again.
    ("Slurm: cancelled", re.compile(r"\bCANCELLED AT\b(?!.*DUE TO JOB REQUEUE)|State=CANCELLED")),
    # srl's batch script: the first component to exit decides the job's end; a non-zero status is a failure.
    ("Slurm: component failed", re.compile(r"srl\[\d+\]: teardown: \S+ exited first \(status [1-9]\d*\)")),
]
# srl's batch job (toolkit/launch/supervisor.py) logs one of these lines, "<date> <time> srl[<job id>]: ...",
# before it stops its own job steps: after a component exited (teardown), or on the pre-timeout signal (checkpoint,
# requeue). slurmstepd then writes "*** STEP <job>.<step> ON <node> CANCELLED AT <time> ***" into the log of each step
# it stopped. Those steps were stopped by srl, not cancelled by a user or administrator: a clean run ends this way.
# A user's scancel of the job is told apart by the batch script's "received SIGTERM: stopping" (and slurmstepd's
# "*** JOB <id> ... CANCELLED ***"), which is not an own stop.
OWN_STOP_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) srl\[(\d+)\]: "
    r"(?:teardown: |received SIG\w+: asking the trainer to checkpoint)"
)
STEP_CANCELLED_RE = re.compile(r"\*\*\* STEP (\d+)(?:\+\d+)?\.\S+ ON \S+ CANCELLED AT (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
LOG_SUFFIXES = {".log", ".out", ".err", ".txt"}
# Mean per-token KL (nats) between a stale batch's sampling policy and the trainer's weights above which updates
# are too large. Healthy runs of the reverse-text job measure far below it (their mismatch_kl, the same quantity
# at zero updates apart, stays under 1e-3); a learning rate of 1.0 on the tiny model measured 3-52.
OFF_POLICY_KL_MAX = 1.0
# Gradient norm (L2 over all parameters, before clipping) at or below which no step is a spike, unless the run clips
# tighter (``trainer.optim.max_norm`` below it: the run itself calls smaller norms large). Relative jumps below it
# are the ordinary noise of small gradients: the README job's RL run after SFT, with most groups carrying no signal,
# measured norms of 0.001-0.53 with 29 steps 10x above their recent median. A looser clip (1e9 = none) does not
# raise it: a diverging run with clipping off must still be caught.
GRAD_NORM_FLOOR = 1.0
# A spike this many times the scale or more (or a non-finite norm) is an error; a smaller one only a warning.
GRAD_NORM_ERROR_SCALE = 10.0
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass
class Finding:
    """One diagnosed failure.

    ``boundary`` is the failure class ("TaskError", "trainer instability", "Slurm: time limit", ...);
    ``severity`` "error" | "warning" | "info"; ``evidence`` holds counts, ``first_step``, and ``log_file`` /
    ``log_line`` (1-based) / ``excerpt`` of the first log occurrence when one was found; ``advice`` is what to do.
    """

    boundary: str
    severity: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""


@dataclass
class _LogHit:
    file: Path
    line: int
    text: str
    count: int = 1


def diagnose(
    run_dir: Path | RunDir,
    *,
    low_reward: float = 0.1,
    group_share: float = 0.5,
    error_share: float = 0.0,
) -> list[Finding]:
    """Classify the failures of one run; most severe first. Empty list when nothing is wrong.

    ``low_reward``: mean valid reward at or below this is "valid low reward" (rewards on a 0-1 scale).
    ``group_share``: share of train groups all-zero (all-one) above which groups are flagged.
    ``error_share``: share of errored rollouts of a class above which it is reported (0 = any).
    A run file that exists but cannot be read (a torn rollout store) is an error finding naming it.
    Raises ``FileNotFoundError`` if ``run_dir`` does not exist or is not a run directory.
    """
    run = require_run_dir(run_dir)
    class_hits, slurm_hits = scan_logs(run)
    findings: list[Finding] = []
    columns = ["step", "kind", "env", "group_id", "reward", "error_class", "error_message", "off_policy_age"]
    rollouts, problem = read_store(run, columns)
    if problem:
        findings.append(
            Finding(
                boundary="unreadable run file",
                severity="error",
                summary=problem,
                advice=ADVICE["unreadable run file"],
            )
        )
    findings += _error_findings(rollouts, class_hits, run, error_share)
    if rollouts is not None and len(rollouts):
        config = read_json(run.resolved("rl"))
        findings += _reward_findings(rollouts, low_reward, group_share, distilling_envs(config))
        findings += _starved_env_findings(rollouts, config, group_share)
    metrics = load_metrics(run)
    findings += _trainer_findings(metrics, run)
    findings += _distillation_findings(metrics)
    findings += _local_findings(run)
    own_stop = _stop_criterion_ending(run)
    for boundary, hit in slurm_hits.items():
        if boundary == "Slurm: component failed" and own_stop is not None:
            findings.append(_criterion_finding(own_stop))  # the orchestrator exited first on purpose
            continue
        summary, raised = f"{boundary} in the job log ({hit.count} line(s))", {}
        if boundary == "Slurm: component failed":
            summary, raised = _failure_raised(run, summary)
        findings.append(
            Finding(
                boundary=boundary,
                severity="error",
                summary=summary,
                evidence={"count": hit.count, **_where(hit, run), **raised},
                advice=ADVICE[boundary],
            )
        )
    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
    return findings


# The first line of a role log that says why it failed: a logged error (``srl.trainer ERROR DataError: ...``) or
# the start of a traceback.
_LOG_ERROR_RE = re.compile(r"\s(?:ERROR|CRITICAL)\s|^Traceback \(most recent call last\)")


def _stop_criterion_ending(run: RunDir) -> ending.Ending | None:
    """The run's ending when srl itself stopped it on a stop criterion (the zero-signal guard, divergence, ...),
    else None. Such a run exits non-zero on purpose: its status is no component failure."""
    end = ending.read(run)
    return end if end is not None and end.cause in (ending.NO_SIGNAL, ending.CRITERION) else None


def _criterion_finding(end: ending.Ending) -> Finding:
    return Finding(
        boundary="stopped by a stop criterion",
        severity="warning",
        summary=f"srl {end.summary()} (exit status {end.exit_status})",
        evidence={"criterion": end.criterion, "step": end.step, "status": end.exit_status},
        advice=ADVICE["stopped by a stop criterion"],
    )


def _local_findings(run: RunDir) -> list[Finding]:
    """A local run whose launcher ended with a failure status (``launcher/local.json``), with the first error line
    of that attempt's role logs. A local run has no batch log, so without this its failure (a trainer refusing a
    data row, a crash at start-up) reads as "no failures found". Ctrl-C (130) is no failure."""
    rec = read_local_record(run)
    status = rec.get("status") if rec is not None else None
    if not isinstance(status, int) or status in (0, 130):
        return []
    own = _stop_criterion_ending(run)
    if own is not None and own.exit_status == status:
        return [_criterion_finding(own)]
    attempt = rec.get("attempt")
    evidence: dict[str, Any] = {"status": status, "attempt": attempt}
    logs = run.log_attempt(attempt) if isinstance(attempt, int) else None
    hit = None
    for path in sorted(logs.glob("*.log")) if logs is not None and logs.is_dir() else []:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    if _LOG_ERROR_RE.search(line):
                        hit = _LogHit(path, lineno, line.strip()[:300])
                        break
        except OSError:
            continue
        if hit is not None:
            break
    evidence.update(_where(hit, run))
    summary, raised = _failure_raised(run, f"the local launcher of attempt {attempt} ended with status {status}")
    evidence.update(raised)
    return [
        Finding(
            boundary="local: launcher failed",
            severity="error",
            summary=summary,
            evidence=evidence,
            advice=ADVICE["local: launcher failed"],
        )
    ]


def _failure_raised(run: RunDir, summary: str) -> tuple[str, dict[str, Any]]:
    """``summary`` with what the failed role raised: the exception its traceback ends with and the line that raised
    it (the run's ending record, else the last traceback of that attempt's role logs), and that as evidence
    (``exception``, ``raised_at``, ``failed_role``). Unchanged when no traceback names it."""
    end = ending.read(run)
    role, exc, at = (
        (end.role, end.exception, end.where) if end is not None and end.cause == ending.FAILED else (None, None, None)
    )
    if exc is None:
        logs = run.latest_logs
        named = end.role if end is not None and end.cause == ending.FAILED else None

        def order(path: Path) -> tuple[int, str]:
            # The failed role's own log first (an engine log may hold a harmless traceback that sorts earlier).
            return (0 if path.stem == named else 1 if path.stem in ("trainer", "orchestrator") else 2, path.name)

        for path in sorted(logs.glob("*.log"), key=order) if logs.is_dir() else []:
            found = ending.last_exception(path)
            if found is not None:
                role, exc, at = path.stem, found.exception, found.where
                break
    if exc is None:
        return summary, {}
    by = f"{role} raised " if role else "raised "
    return (
        f"{summary}: {by}{exc}" + (f" at {at}" if at else ""),
        {"failed_role": role, "exception": exc, "raised_at": at},
    )


def scan_logs(run: RunDir) -> tuple[dict[str, _LogHit], dict[str, _LogHit]]:
    """First occurrence and count of each error class name and each Slurm-level pattern in the run's text logs.

    Scans files under ``logs/`` and ``launcher/`` (suffixes .log/.out/.err/.txt), oldest attempt first, so the first
    occurrence is the earliest one. Symlinked directories (``logs/latest``) are not followed twice. A job step's
    "CANCELLED" line at or after its batch script's own stop (``OWN_STOP_RE``: srl stopping the remaining steps of
    its job) is not counted as a cancel.
    """
    classes: dict[str, _LogHit] = {}
    slurm: dict[str, _LogHit] = {}
    cancels: list[tuple[Path, int, str]] = []  # decided once every batch log (own stops) has been read
    own_stops: dict[str, str] = {}  # job id -> earliest own stop, "YYYY-MM-DD HH:MM:SS"
    for path in _log_files(run):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    for m in set(ERROR_CLASS_RE.findall(line)):
                        _record(classes, m, path, lineno, line)
                    own = OWN_STOP_RE.match(line)
                    if own and own.group(1) < own_stops.get(own.group(2), "9999"):
                        own_stops[own.group(2)] = own.group(1)
                    for name, pat in SLURM_PATTERNS:
                        if pat.search(line):
                            if name == "Slurm: cancelled":
                                cancels.append((path, lineno, line))
                            else:
                                _record(slurm, name, path, lineno, line)
                            break
        except OSError:
            continue
    for path, lineno, line in cancels:
        if not _stopped_by_srl(line, own_stops):
            _record(slurm, "Slurm: cancelled", path, lineno, line)
    return classes, slurm


def _stopped_by_srl(line: str, own_stops: dict[str, str]) -> bool:
    """Whether ``line`` is slurmstepd's cancel of one job step that srl's own batch script stopped: a STEP (not JOB)
    line of a job whose batch log shows an own stop at or before the cancel time (same clock: both are written on
    the job's nodes in local time, to the second)."""
    m = STEP_CANCELLED_RE.search(line)
    if m is None or m.group(1) not in own_stops:
        return False
    return m.group(2).replace("T", " ") >= own_stops[m.group(1)]


def _record(hits: dict[str, _LogHit], key: str, path: Path, lineno: int, line: str) -> None:
    if key in hits:
        hits[key].count += 1
    else:
        hits[key] = _LogHit(path, lineno, line.strip()[:300])


def _log_files(run: RunDir) -> list[Path]:
    out: list[Path] = []
    for base in (run.logs, run.launcher):
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*"), key=_attempt_order):
            if (
                p.is_file()
                and p.suffix in LOG_SUFFIXES
                and not any(part.is_symlink() for part in _parents_below(p, base))
            ):
                out.append(p)
    return out


def _parents_below(p: Path, base: Path) -> list[Path]:
    parts, cur = [], p.parent
    while cur != base and base in cur.parents:
        parts.append(cur)
        cur = cur.parent
    return parts


def _attempt_order(p: Path) -> tuple[int, str]:
    m = re.search(r"attempt_(\d+)", str(p))
    return (int(m.group(1)) if m else 0, str(p))


def _where(hit: _LogHit | None, run: RunDir) -> dict[str, Any]:
    if hit is None:
        return {}
    try:
        rel = str(hit.file.relative_to(run.root))
    except ValueError:
        rel = str(hit.file)
    return {"log_file": rel, "log_line": hit.line, "excerpt": hit.text}


def _error_findings(
    rollouts: pd.DataFrame | None, class_hits: dict[str, _LogHit], run: RunDir, error_share: float
) -> list[Finding]:
    per_boundary: dict[str, dict[str, Any]] = {}
    total = 0 if rollouts is None else len(rollouts)
    if rollouts is not None and total:
        err = rollouts[rollouts["error_class"].notna()]
        for cls, sub in err.groupby(err["error_class"].astype(str), sort=True):
            boundary = CLASS_BOUNDARY.get(cls, cls)
            ev = per_boundary.setdefault(boundary, {"count": 0, "classes": {}, "first_step": None, "envs": set()})
            ev["count"] += len(sub)
            ev["classes"][cls] = len(sub)
            first = int(sub["step"].min())
            ev["first_step"] = first if ev["first_step"] is None else min(ev["first_step"], first)
            ev["envs"].update(sub["env"].astype(str).unique().tolist())
            msg = sub["error_message"].dropna()
            if len(msg) and "first_message" not in ev:
                ev["first_message"] = str(msg.iloc[0])[:300]
    for cls, hit in class_hits.items():
        boundary = CLASS_BOUNDARY[cls]
        ev = per_boundary.setdefault(boundary, {"count": 0, "classes": {}, "first_step": None, "envs": set()})
        ev.setdefault("log_mentions", 0)
        ev["log_mentions"] += hit.count
        if "log_file" not in ev:
            ev.update(_where(hit, run))
    findings = []
    for boundary, ev in per_boundary.items():
        share = ev["count"] / total if total else None
        if ev["count"] and share is not None and share <= error_share:
            continue
        ev["envs"] = sorted(ev["envs"])
        if share is not None:
            ev["share_of_rollouts"] = round(share, 4)
        where = f"{ev['count']} errored rollout(s)" if ev["count"] else "no errored rollouts in the store"
        if ev.get("log_mentions"):
            where += f", {ev['log_mentions']} log line(s)"
        first = f", first at step {ev['first_step']}" if ev["first_step"] is not None else ""
        findings.append(
            Finding(
                boundary=boundary,
                severity="error",
                summary=f"{where}{first}",
                evidence=ev,
                advice=ADVICE.get(boundary, ""),
            )
        )
    return findings


def distilling_envs(config: dict[str, Any]) -> set[str]:
    """Names of the train envs of a resolved run config (``rl.json`` as a dict) that train by distillation
    (``opd``, ``opsd``: their own ``algo`` or the run's ``train.algo``); their groups need no reward spread."""
    train = (config.get("orchestrator") or {}).get("train") or {}
    default = (train.get("algo") or {}).get("type", "grpo")
    return {
        str(env.get("name"))
        for env in train.get("env") or []
        if ((env.get("algo") or {}).get("type") or default) in ("opd", "opsd")
    }


def _reward_findings(
    rollouts: pd.DataFrame, low_reward: float, group_share: float, distilling: set[str] = frozenset()
) -> list[Finding]:
    """Valid low reward over the train rollouts; all-zero and all-one groups over the envs that learn from reward
    spread within a group (not the ``distilling`` ones)."""
    kinds = set(rollouts["kind"].astype(str))
    df = rollouts[rollouts["kind"].astype(str) == ("train" if "train" in kinds else min(kinds))]
    valid = df[df["error_class"].isna()]
    out: list[Finding] = []
    if valid.empty:
        return out
    groups = group_stats(df[~df["env"].astype(str).isin(distilling)])
    groups = groups[groups["valid"] > 0]
    error_rate = 1 - len(valid) / len(df)
    mean = float(valid["reward"].mean())
    zero = float((groups["max"] == 0).mean()) if len(groups) else 0.0
    one = float(groups["solve_all"].mean()) if len(groups) else 0.0
    if zero > group_share:
        first_bad = groups[groups["max"] == 0]["step"].min()
        out.append(
            Finding(
                boundary="all-zero groups",
                severity="warning",
                summary=f"{zero:.0%} of {len(groups)} groups have zero reward on every rollout",
                evidence={
                    "groups": len(groups),
                    "all_zero_groups": int((groups["max"] == 0).sum()),
                    "share": round(zero, 4),
                    "first_step": int(first_bad),
                },
                advice=ADVICE["all-zero groups"],
            )
        )
    if one > group_share:
        out.append(
            Finding(
                boundary="all-one groups",
                severity="warning",
                summary=f"{one:.0%} of {len(groups)} groups are solved by every rollout",
                evidence={
                    "groups": len(groups),
                    "all_one_groups": int(groups["solve_all"].sum()),
                    "share": round(one, 4),
                },
                advice=ADVICE["all-one groups"],
            )
        )
    if mean <= low_reward and error_rate < 0.5:
        by_step = valid.groupby("step")["reward"].mean()
        out.append(
            Finding(
                boundary="valid low reward",
                severity="warning",
                summary=f"mean reward {mean:.3f} over {len(valid)} valid rollouts ({error_rate:.0%} errored)",
                evidence={
                    "valid_rollouts": len(valid),
                    "reward_mean": round(mean, 4),
                    "errored_share": round(error_rate, 4),
                    "first_step": int(by_step.index.min()),
                    "last_step_reward_mean": round(float(by_step.iloc[-1]), 4),
                },
                advice=ADVICE["valid low reward"],
            )
        )
    return out


def _starved_env_findings(rollouts: pd.DataFrame, config: dict[str, Any], share: float) -> list[Finding]:
    """Train envs most of whose groups were dropped for being older than the run's off-policy bound (a group is
    dropped when one of its valid rollouts is: the orchestrator's rule). Needs the resolved config for the bound;
    none without it, or for a run without a bound."""
    orch = config.get("orchestrator")
    if not isinstance(orch, dict) or "max_async_level" not in orch:
        return []
    bound = off_policy_bound(
        orch["max_async_level"], orch.get("max_off_policy_steps"), bool(orch.get("update_weights", True))
    )
    train = rollouts[(rollouts["kind"].astype(str) == "train") & rollouts["error_class"].isna()]
    if bound is None or train.empty:
        return []
    groups = train.groupby([train["env"].astype(str), "group_id"], observed=True)["off_policy_age"].max()
    out: list[Finding] = []
    for env, ages in groups.groupby(level=0):
        dropped = int((ages > bound).sum())
        if len(ages) >= 4 and dropped / len(ages) > share:
            out.append(
                Finding(
                    boundary="env starved by the off-policy bound",
                    severity="warning",
                    summary=f"env {env}: {dropped} of its {len(ages)} groups finished more than {bound} policy "
                    f"version(s) old and were dropped",
                    evidence={"env": env, "groups": len(ages), "dropped_groups": dropped, "bound": bound},
                    advice=ADVICE["env starved by the off-policy bound"],
                )
            )
    return out


def _distillation_findings(metrics: pd.DataFrame) -> list[Finding]:
    """Distilling envs (those with ``teacher/<env>/kl``) whose replies shrank to at most half their first length
    while the KL to the reference fell below a tenth of its start and reward fell: the collapse of (self-)
    distillation onto the empty reply. Compares the mean of the first and the last three orchestrator steps; needs
    at least six."""
    orch = role_metrics(metrics, "orchestrator")
    out: list[Finding] = []
    for col in [c for c in orch.columns if c.startswith("teacher/") and c.endswith("/kl")]:
        env = col[len("teacher/") : -len("/kl")]
        need = [col, f"teacher/{env}/tokens", f"batch/{env}/rollouts", f"reward/{env}/mean"]
        if not all(c in orch.columns for c in need):
            continue
        rows = orch[need].astype(float).dropna()
        if len(rows) < 6:
            continue
        first, last = rows.iloc[:3].mean(), rows.iloc[-3:].mean()
        length = (first[need[1]] / max(first[need[2]], 1.0), last[need[1]] / max(last[need[2]], 1.0))
        kl, reward = (first[col], last[col]), (first[need[3]], last[need[3]])
        if length[1] <= 0.5 * length[0] and kl[1] < 0.1 * kl[0] and reward[1] < reward[0]:
            out.append(
                Finding(
                    boundary="distillation collapsed to short replies",
                    severity="error",
                    summary=f"env {env}: replies shrank from {length[0]:.1f} to {length[1]:.1f} tokens while the KL "
                    f"to the reference fell from {kl[0]:.3f} to {kl[1]:.3f} and reward from {reward[0]:.3f} to "
                    f"{reward[1]:.3f} (first vs last three steps)",
                    evidence={
                        "env": env,
                        "tokens_per_reply": [round(float(x), 2) for x in length],
                        "kl": [round(float(x), 4) for x in kl],
                        "reward": [round(float(x), 4) for x in reward],
                    },
                    advice=ADVICE["distillation collapsed to short replies"],
                )
            )
    return out


def _trainer_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """Trainer rows indexed by step, keeping all-NaN columns: a loss that is NaN on every step (a run that
    diverged at step 1) is the finding, so it must not be dropped like a metric the trainer never wrote."""
    tr = role_metrics(metrics, "trainer")
    if tr.empty or "loss/mean" in tr.columns or "loss/mean" not in metrics.columns:
        return tr
    rows = metrics[metrics["role"] == "trainer"].set_index("step").sort_index()
    return tr.join(rows[["loss/mean"]])


def grad_norm_scale(config: dict[str, Any]) -> float:
    """The gradient norm above which a jump counts: :data:`GRAD_NORM_FLOOR`, or the run's ``trainer.optim.max_norm``
    (clip threshold) when that is positive and smaller."""
    v = dotted(config, "trainer.optim.max_norm")
    clip = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else math.inf
    return min(GRAD_NORM_FLOOR, clip)


def signal_share(metrics: pd.DataFrame) -> pd.Series:
    """Per orchestrator step, the share of its fresh groups that carried signal (rewards not all equal):
    ``filter/signal_groups / filter/groups_offered``. Empty when the run did not record them."""
    orch = role_metrics(metrics, "orchestrator")
    if not {"filter/signal_groups", "filter/groups_offered"} <= set(orch.columns):
        return pd.Series(dtype=float)
    offered = orch["filter/groups_offered"].astype(float)
    return (orch["filter/signal_groups"].astype(float) / offered.where(offered > 0)).dropna()


def _trainer_findings(metrics: pd.DataFrame, run: RunDir) -> list[Finding]:
    tr = _trainer_rows(metrics)
    if tr.empty:
        return []
    problems: list[str] = []
    evidence: dict[str, Any] = {}
    first_steps: list[int] = []
    severity = "error"  # lowered to a warning when small grad-norm spikes are the only problem
    if "loss/mean" in tr.columns:
        loss = tr["loss/mean"].astype(float)
        bad = loss[~np.isfinite(loss.to_numpy())]
        if len(bad):
            problems.append(f"loss is NaN/inf at {len(bad)} step(s)")
            evidence["loss_nonfinite_steps"] = len(bad)
            first_steps.append(int(bad.index[0]))
    if "mismatch_kl/mean" in tr.columns:
        kl = tr["mismatch_kl/mean"].astype(float).dropna()
        growing, early, late = _growing(kl)
        if growing:
            problems.append(f"mismatch_kl grew from {early:.3g} to {late:.3g}")
            evidence.update(mismatch_kl_early=early, mismatch_kl_late=late)
            first_steps.append(int(kl.index[kl > max(2 * early, 1e-3)][0]))
    if "off_policy_kl/mean" in tr.columns:
        # KL (nats/token) between the policy that sampled a stale batch and the trainer's current weights: how far
        # the last update(s) moved the policy. A healthy learning rate moves it by far less than a nat per token.
        opk = tr["off_policy_kl/mean"].astype(float).dropna()
        far = opk[(opk > OFF_POLICY_KL_MAX) | ~np.isfinite(opk.to_numpy())]
        if len(far):
            problems.append(
                f"off-policy KL up to {float(far.max()):.3g} nats/token at {len(far)} step(s): each update moves "
                f"the policy too far (limit {OFF_POLICY_KL_MAX:g})"
            )
            evidence.update(off_policy_kl_steps=len(far), off_policy_kl_max=float(far.max()))
            first_steps.append(int(far.index[0]))
    if "optim/skipped_update" in tr.columns:
        # The trainer skips an update whose loss or gradient is NaN/inf (toolkit/trainer/step.py).
        skipped = tr["optim/skipped_update"].astype(float).fillna(0.0)
        skipped = skipped[skipped > 0]
        if len(skipped):
            problems.append(f"{len(skipped)} update(s) skipped for a NaN/inf loss or gradient")
            evidence.update(skipped_updates=len(skipped))
            first_steps.append(int(skipped.index[0]))
    spiky = False
    if "optim/grad_norm" in tr.columns:
        config = read_json(run.run_config())
        scale = grad_norm_scale(config)
        share = signal_share(metrics)
        spikes = _spikes(tr["optim/grad_norm"].astype(float).dropna(), floor=scale, share=share)
        if len(spikes):
            peak = float(spikes.max()) if np.isfinite(spikes).all() else math.inf
            spiky = peak >= GRAD_NORM_ERROR_SCALE * scale
            signal = f"; {float(share.mean()):.0%} of groups carried signal" if len(share) else ""
            problems.append(f"{len(spikes)} grad-norm spike(s) above {scale:g}, max {peak:.3g}{signal}")
            evidence.update(grad_norm_spikes=len(spikes), grad_norm_max=peak, grad_norm_scale=scale)
            if len(share):
                evidence["signal_group_share"] = round(float(share.mean()), 4)
            first_steps.append(int(spikes.index[0]))
    if "entropy/mean" in tr.columns:
        ent = tr["entropy/mean"].astype(float).dropna()
        if len(ent) >= 6:
            k = max(len(ent) // 3, 2)
            early, late = float(ent.iloc[:k].median()), float(ent.iloc[-k:].median())
            if early > 0 and late < 0.2 * early:
                problems.append(f"entropy collapsed from {early:.3g} to {late:.3g}")
                evidence.update(entropy_early=early, entropy_late=late)
                first_steps.append(int(ent.index[ent < 0.5 * early][0]))
    if not problems:
        return []
    if "grad_norm_spikes" in evidence and len(problems) == 1 and not spiky:
        severity = "warning"  # finite spikes under GRAD_NORM_ERROR_SCALE x the scale, and nothing else
    evidence["first_step"] = min(first_steps)
    evidence["source"] = str(run.metrics.relative_to(run.root))
    return [
        Finding(
            boundary="trainer instability",
            severity=severity,
            summary="; ".join(problems),
            evidence=evidence,
            advice=ADVICE["trainer instability"],
        )
    ]


def _growing(series: pd.Series) -> tuple[bool, float, float]:
    """Median of the last third above 4x the first third's (and above 1e-3): a sustained rise, not noise."""
    if len(series) < 6:
        return (False, math.nan, math.nan)
    k = max(len(series) // 3, 2)
    early, late = float(series.iloc[:k].median()), float(series.iloc[-k:].median())
    return (late > max(4 * early, 1e-3), early, late)


def _spikes(
    series: pd.Series, *, floor: float, share: pd.Series | None = None, factor: float = 10.0, window: int = 10
) -> pd.Series:
    """Grad norms that are non-finite, or above ``floor`` and above ``factor`` x the median of the preceding
    ``window`` steps (at least 3 of them).

    The relative test divides each step's norm by ``share`` (its share of signal-carrying groups, indexed by step)
    where that is known and positive: a group whose rewards are all equal has zero advantage and adds nothing to
    the gradient, so a step with a tenth of the signal has about a tenth of the norm, and the jump back to a full
    step is no spike. Steps without a known share are compared as they are.
    """
    scaled = series
    if share is not None and len(share):
        s = share.reindex(series.index)
        scaled = series.where(~(s > 0), series / s)
    prev = scaled.shift(1).rolling(window, min_periods=3).median()
    spike = ((scaled > factor * prev) & (series > floor)) | ~np.isfinite(series)
    return series[spike.fillna(False)]


def format_findings(findings: list[Finding]) -> str:
    """Plain-text rendering (no rich markup): one block per finding with evidence lines and advice."""
    if not findings:
        return (
            "No failures found: no errored rollouts, no trainer instability, no failed launcher, no Slurm-level "
            "causes in the logs.\n"
        )
    lines = []
    for i, f in enumerate(findings, 1):
        lines.append(f"{i}. [{f.severity.upper()}] {f.boundary}: {f.summary}")
        for key, value in f.evidence.items():
            if value in (None, [], {}):
                continue
            lines.append(f"     {key}: {value}")
        if f.advice:
            lines.append(f"     advice: {f.advice}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.diagnose RUN_DIR``: print findings; exit 1 when any finding is an error, 2 when the run
    directory is missing, else 0."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="srl diagnose", description="Classify the failures of a run.")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        findings = diagnose(args.run_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_findings(findings), end="")
    return 1 if any(f.severity == "error" for f in findings) else 0


if __name__ == "__main__":
    raise SystemExit(main())
