"""Offline reports: ``build_report(run_dirs, out_dir)`` writes an HTML report (figures embedded as base64 PNG), a
Markdown twin (figures as PNG files next to it), and CSV tables.

Each run opens with its outcome (:func:`_outcome`: how it ended, steps, wall time, eval first -> best -> last, the
reward and eval figures, the top diagnosis findings), then the deliverable sections of a run report: 1. version and
resolved config; 2. taskset, harness, runtime, renderer, group, batch and eval settings; 3. pre-training validation
evidence (the step-0 eval); 4. resource and cost envelope; 5. monitoring and stop criteria; 6. failures with their
boundary (:mod:`analysis.diagnose`). When runs carry a ``sweep_point`` in ``run_meta.json``, a sweep section compares
the points: final and best metric per point, mean and 95% t-interval across seeds, and a comparison figure.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import envelope as env_mod
from analysis import samples as samples_mod
from analysis.diagnose import Finding, diagnose, format_findings
from analysis.figures import RUN_FIGURES, eval_scores, fig_eval, fig_sweep, to_png
from analysis.loaders import RunData, dotted, load_metrics, load_run, read_json, role_metrics
from analysis.summary import ALL_ENVS, env_summary, error_counts, step_summary, t_interval
from toolkit.run import ending as ending_mod
from toolkit.run.launcher import read_local_record
from toolkit.run.layout import STABLE_MARKER, RunDir, numbered_steps
from toolkit.run.metrics import STDERR_SUFFIX, is_eval_score
from toolkit.run.stop import criteria_from_table, replay
from toolkit.run.verdict import read_verdicts

# Figures shown in a run's outcome, at the top of its section (and not again under Figures).
OUTCOME_FIGURES = ("reward", "eval")
# Diagnosis findings shown in the outcome (all of them are in section 6).
TOP_FINDINGS = 3

MONITORED = [
    ("orchestrator", "reward/all/mean"),
    ("orchestrator", "solve_none"),
    ("orchestrator", "solve_all"),
    ("orchestrator", "effective_batch_size"),
    ("orchestrator", "errored_rollouts"),
    ("orchestrator", "truncated_rollouts"),
    ("orchestrator", "seq_len/mean"),
    ("orchestrator", "num_turns/mean"),
    ("orchestrator", "off_policy/max"),
    ("orchestrator", "time/wait_for_policy"),
    ("trainer", "mismatch_kl/mean"),
    ("trainer", "entropy/mean"),
    ("trainer", "optim/grad_norm"),
    ("trainer", "loss/mean"),
    ("trainer", "perf/throughput"),
    ("trainer", "time/wait_for_batch"),
]
SWEEP_METRIC = "reward/all/mean"
# Sweep comparison figures at most: the held-out scores, then the train reward.
MAX_SWEEP_FIGURES = 4


@dataclass
class ReportPaths:
    """Files written by :func:`build_report`: ``html`` and ``markdown`` reports, ``figures`` (name -> PNG path),
    ``tables`` (name -> CSV path)."""

    html: Path
    markdown: Path
    figures: dict[str, Path] = field(default_factory=dict)
    tables: dict[str, Path] = field(default_factory=dict)


class _Doc:
    """Builds the HTML and Markdown twins side by side so their sections cannot drift apart."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.html: list[str] = []
        self.md: list[str] = []
        self.paths = ReportPaths(out_dir / "report.html", out_dir / "report.md")

    def heading(self, text: str, level: int) -> None:
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")
        self.md += ["#" * level + " " + text, ""]

    def para(self, text: str) -> None:
        self.html.append(f"<p>{html.escape(text)}</p>")
        self.md += [text, ""]

    def pre(self, text: str, summary: str | None = None) -> None:
        body = f"<pre>{html.escape(text)}</pre>"
        self.html.append(f"<details><summary>{html.escape(summary)}</summary>{body}</details>" if summary else body)
        block = ["```", text.rstrip("\n"), "```", ""]
        # Markdown renderers that take HTML (GitHub, most viewers) fold it the same way as the HTML twin.
        self.md += (
            [f"<details><summary>{html.escape(summary)}</summary>", "", *block, "</details>", ""] if summary else block
        )

    def table(self, df: pd.DataFrame, name: str | None = None, max_rows: int = 60) -> None:
        if name:
            path = self.out_dir / "tables" / f"{name}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            df.to_csv(path, index=False)
            self.paths.tables[name] = path
        shown = df if len(df) <= max_rows else df.tail(max_rows)
        if len(df) > max_rows:
            self.para(f"(last {max_rows} of {len(df)} rows; full table in tables/{name}.csv)")
        table = shown.to_html(
            index=False, float_format=lambda v: f"{v:.4g}", na_rep="", border=0, classes="tbl", escape=True
        )
        # A wide table scrolls inside its own box instead of running off the page.
        self.html.append(f'<div class="scroll">{table}</div>')
        self.md += [_md_table(shown), ""]

    def kv(self, rows: list[tuple[str, Any]]) -> None:
        self.table(pd.DataFrame(rows, columns=["setting", "value"]).astype(str))

    def raw(self, html_text: str, md_lines: list[str]) -> None:
        """Append HTML (already escaped) and its Markdown twin."""
        self.html.append(html_text)
        self.md += md_lines

    def figure(self, name: str, fig: Any) -> None:
        png = to_png(fig)
        path = self.out_dir / "figures" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        self.paths.figures[name] = path
        b64 = base64.b64encode(png).decode("ascii")
        self.html.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{b64}"/></figure>')
        self.md += [f"![{name}](figures/{name}.png)", ""]


def _md_table(df: pd.DataFrame) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.4g}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(cell(v) for v in rec) + " |" for rec in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])


def build_report(run_dirs: list[Path], out_dir: Path, *, run_figures: bool = True) -> ReportPaths:
    """Write ``report.html``, ``report.md``, ``figures/*.png`` and ``tables/*.csv`` under ``out_dir`` for the runs
    in ``run_dirs`` (one section each, plus a sweep section when they carry sweep points). A sweep root (the
    directory of ``srl sweep``'s ``manifest.json``) stands for all its points (:func:`expand_sweep_dirs`).

    ``run_figures=False`` skips the per-run figures (about 0.3 s of CPU each, nine per run), which a report over a
    large sweep may not want; the sweep comparison figure is always drawn.

    Raises ``ValueError`` for an empty ``run_dirs`` and ``FileNotFoundError`` for a missing run directory.
    """
    if not run_dirs:
        raise ValueError("build_report needs at least one run directory")
    run_dirs = expand_sweep_dirs(run_dirs)
    out_dir = Path(out_dir)
    runs = [load_run(Path(r)) for r in run_dirs]  # first: a path that is no run gets no reports/ written into it
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = _Doc(out_dir)
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs"
    doc.heading(f"srl report: {title}", 1)
    if any("sweep_point" in r.meta for r in runs):
        _sweep_section(doc, runs)
    for run in runs:
        _run_section(doc, run, prefix=_safe(run.name) if len(runs) > 1 else "", figures=run_figures)
    _write(doc, title)
    return doc.paths


def expand_sweep_dirs(paths: list[Path]) -> list[Path]:
    """Replace each sweep root (a directory holding the ``manifest.json`` that ``srl sweep`` writes) by the run
    directories of its points, in array-index order; other paths pass through unchanged.

    A point whose run directory does not exist yet (its array task has not started) is left out with a note on
    stderr. Raises ``FileNotFoundError`` when a sweep root has no point run directory at all.
    """
    import sys

    out: list[Path] = []
    for p in map(Path, paths):
        manifest = p / "manifest.json"
        points = _manifest_points(manifest) if manifest.is_file() else None
        if points is None:
            out.append(p)
            continue
        # The manifest holds absolute paths; a sweep copied elsewhere still has its points next to the manifest.
        dirs = {
            str(pt.get("point_id")): next(
                (d for d in (Path(pt["run_dir"]), p / str(pt.get("point_id"))) if d.is_dir()), None
            )
            for pt in points
        }
        found = [d for d in dirs.values() if d is not None]
        missing = [pid for pid, d in dirs.items() if d is None]
        if missing:
            print(f"srl report: sweep {p}: no run directory yet for {', '.join(missing)}", file=sys.stderr)
        if not found:
            raise FileNotFoundError(f"sweep {p} has no point run directory yet ({len(points)} points in {manifest})")
        out += found
    return out


def _manifest_points(manifest: Path) -> list[dict[str, Any]] | None:
    """The ``points`` list of a sweep manifest, or None when the file is not one (then the directory is a run)."""
    points = read_json(manifest).get("points")
    if not isinstance(points, list) or not all(
        isinstance(pt, dict) and "run_dir" in pt and isinstance(pt.get("index", 0), int) for pt in points
    ):
        return None
    return sorted(points, key=lambda pt: pt.get("index", 0))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _run_section(doc: _Doc, run: RunData, prefix: str, figures: bool) -> None:
    def key(name: str) -> str:
        return f"{prefix}_{name}" if prefix else name

    level = 2
    doc.heading(f"Run {run.name}", level)
    steps = step_summary(run.rollouts) if run.rollouts is not None else None
    findings: list[Finding] = diagnose(run.run)
    _outcome(doc, run, steps, findings, key, figures=figures)
    doc.para(f"Run directory: {run.run.root}. Run id: {run.meta.get('run_id', 'unknown')}.")

    doc.heading("1. Version and resolved config", level + 1)
    # An SFT run's own config is sft.json (its rl.json is only the placement view of it).
    sft = run.run.resolved("sft")
    shown = read_json(sft) if sft.is_file() else run.config
    doc.para(
        f"srl {_version()}. Resolved config: {sft if sft.is_file() else run.run.resolved('rl')}"
        + ("" if shown else " (not found: the run was not started through srl rl or srl sft).")
    )
    if shown:
        doc.pre(
            json.dumps(shown, indent=2, sort_keys=True), summary=f"resolved {'sft' if sft.is_file() else 'rl'}.json"
        )

    doc.heading("2. Taskset, harness, runtime, renderer, group, batch and eval settings", level + 1)
    doc.kv(_sft_settings(shown) if sft.is_file() else _settings(run.config))
    envs = _env_rows(run.config)
    if not envs.empty:
        doc.table(envs)

    doc.heading("3. Pre-training validation evidence", level + 1)
    _validation(doc, run, key)

    doc.heading("4. Resource and cost envelope", level + 1)
    env = env_mod.estimate(
        run.config,
        wall_seconds=_wall_seconds(run),
        store_path=run.run.rollout_store,
        steps=_num_train_steps(run),
        weights_dirs=_stable_broadcasts(run),
    )
    doc.kv(env.rows())
    doc.para(
        "Formulas (analysis/envelope.py): GPU-hours = nodes x GPUs per node x wall hours; checkpoint disk = "
        "(keep_last + 1) x 12 bytes/parameter; trainer memory per GPU = 16 bytes/parameter / world size + "
        "activations; store growth measured from the store file. External dependencies: the model source, "
        "the env servers and any remote runtime named in section 2. " + " ".join(env.notes)
    )

    doc.heading("5. Monitoring and stop criteria", level + 1)
    doc.table(_monitor_table(run.metrics))
    _stop_criteria(doc, run, steps)

    if steps is not None and not steps.empty:
        doc.heading("Summaries", level + 1)
        doc.table(env_summary(run.rollouts), name=key("envs"))
        errors = error_counts(run.rollouts)
        if not errors.empty:
            doc.table(errors, name=key("errors"))
        doc.table(steps[steps["env"] == ALL_ENVS].drop(columns="env"), name=key("steps_all"), max_rows=30)
        steps.to_csv(doc.out_dir / "tables" / f"{key('steps')}.csv", index=False)
        doc.paths.tables[key("steps")] = doc.out_dir / "tables" / f"{key('steps')}.csv"

    _samples(doc, run, key)

    doc.heading("Figures", level + 1)
    drawn = 0
    for name, make in RUN_FIGURES.items() if figures else ():
        if name in OUTCOME_FIGURES:
            continue  # drawn in the outcome at the top
        fig = make(steps, run.metrics)
        if fig is not None:
            doc.figure(key(name), fig)
            drawn += 1
    if not figures:
        doc.para("Per-run figures not drawn (--no-run-figures).")
    elif not drawn:
        doc.para("No rollouts or metrics recorded yet.")

    doc.heading("6. Failures and their boundary", level + 1)
    doc.pre(format_findings(findings))


def _outcome(
    doc: _Doc, run: RunData, steps: pd.DataFrame | None, findings: list[Finding], key: Any, *, figures: bool
) -> None:
    """The run's outcome first: how it ended, steps, wall time, eval first -> best -> last, reward, the reward and
    eval figures side by side, and the top diagnosis findings."""
    doc.raw('<section class="outcome" id="outcome">', [])
    doc.heading("Outcome", 3)
    doc.kv(outcome_rows(run))
    if figures:
        drawn = []
        for name in OUTCOME_FIGURES:
            if name == "eval":
                fig = fig_eval(steps, run.metrics, before=_chain_before(run))
            else:
                fig = RUN_FIGURES[name](steps, run.metrics)
            if fig is not None:
                drawn.append((key(name), fig))
        if drawn:
            doc.raw('<div class="figrow">', [])
            for name, fig in drawn:
                doc.figure(name, fig)
            doc.raw("</div>", [])
    top = findings[:TOP_FINDINGS]
    if top:
        more = f" (all {len(findings)} in section 6)" if len(findings) > len(top) else ""
        doc.para(f"Top findings of srl diagnose{more}:")
        items = [f"[{f.severity.upper()}] {f.boundary}: {f.summary}" for f in top]
        doc.raw(
            "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>", [f"- {i}" for i in items] + [""]
        )
    else:
        doc.para("srl diagnose found no failures.")
    doc.raw("</section>", [])


def outcome_rows(run: RunData) -> list[tuple[str, str]]:
    """(label, value) rows of a run's outcome: how it ended (``toolkit.run.ending``), trainer steps of
    ``max_steps``, wall time, each eval metric first -> best -> last with steps, train reward first -> last."""
    end = ending_mod.read(run.run)
    if end is not None:
        ended = f"{end.summary()} (exit status {end.exit_status})"
    else:
        ended = "not recorded (still running, or its supervisor was killed)"
    rows = [("how the run ended", ended)]
    trainer = role_metrics(run.metrics, "trainer")
    max_steps = run.config.get("max_steps") if run.config else None
    done = int(trainer.index.max()) if len(trainer.index) else 0
    rows.append(("trainer steps", f"{done} of {max_steps}" if max_steps else str(done)))
    wall = _wall_seconds(run)
    if wall is not None:
        h, rem = divmod(round(wall), 3600)
        rows.append(("wall time", f"{h}:{rem // 60:02d}:{rem % 60:02d} (h:mm:ss)"))
    orch = role_metrics(run.metrics, "orchestrator")
    for col in eval_scores(run.metrics):
        s = orch[col].astype(float).dropna()
        if s.empty:
            continue
        err = orch[col + STDERR_SUFFIX].astype(float) if col + STDERR_SUFFIX in orch.columns else None

        def at(step: Any, s: pd.Series = s, err: pd.Series | None = err) -> str:
            e = err.get(step) if err is not None else None
            pm = f" ± {e:.2g}" if e is not None and pd.notna(e) else ""
            return f"{s[step]:.3g}{pm} (step {step})"

        rows.append((f"{col} first -> best -> last", f"{at(s.index[0])} -> {at(s.idxmax())} -> {at(s.index[-1])}"))
    if any(c.endswith(STDERR_SUFFIX) for c in orch.columns):
        rows.append(("eval ± (above)", "one standard error: of the mean over tasks of each task's mean score"))
    if "reward/all/mean" in orch.columns:
        r = orch["reward/all/mean"].astype(float).dropna()
        if not r.empty:
            rows.append(
                (
                    "train reward first -> last",
                    f"{r.iloc[0]:.3g} (step {r.index[0]}) -> {r.iloc[-1]:.3g} (step {r.index[-1]})",
                )
            )
    rows += truncation_rows(samples_mod.truncation(run.rollouts))
    return rows


def truncation_rows(trunc: pd.DataFrame) -> list[tuple[str, str]]:
    """One outcome row per (kind, env) whose rollouts were cut by a length limit: the share over the run and at
    the newest step, with the limit; flagged when the newest step's share is at least
    ``samples.TRUNCATED_HIGH`` (its rewards are then those of cut-off replies)."""
    rows = []
    for t in trunc.itertuples(index=False):
        if not t.truncated_share and not t.last_step_share:
            continue
        flag = (
            "TRUNCATED: rewards are of cut-off replies; raise the limit or check the replies below. "
            if t.last_step_share >= samples_mod.TRUNCATED_HIGH
            else ""
        )
        why = f", limit {t.reason}" if t.reason else ""
        rows.append(
            (
                f"truncated rollouts ({t.kind} {t.env})",
                (
                    f"{flag}{t.last_step_share:.1%} at step {t.last_step}, {t.truncated_share:.1%} of "
                    f"{t.rollouts} over the run{why}"
                ),
            )
        )
    return rows


def _chain_before(run: RunData) -> tuple[str, pd.DataFrame] | None:
    """(label, metrics) of the srl run this run's model came from (an SFT run: ``model.name`` is its run
    directory or that run's ``model/``), when that run recorded held-out evals; None otherwise."""
    name = dotted(run.config, "model.name")
    if not isinstance(name, str) or not name:
        return None
    src = Path(name).expanduser()
    if not (src / "run_meta.json").is_file() and (src.parent / "run_meta.json").is_file():
        src = src.parent  # the run's exported model/ directory, given instead of the run directory
    if not (src / "run_meta.json").is_file() or src.resolve() == run.run.root.resolve():
        return None
    metrics = load_metrics(RunDir(src))
    if not eval_scores(metrics):
        return None
    return (f"{'SFT' if RunDir(src).resolved('sft').is_file() else 'run'} {src.name}", metrics)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("srl")
    except PackageNotFoundError:
        return "(not installed; source tree)"


def _settings(cfg: dict[str, Any]) -> list[tuple[str, Any]]:
    keys = [
        "model.name",
        "max_steps",
        "seed",
        "orchestrator.training_mode",
        "orchestrator.batch_size",
        "orchestrator.group_size",
        "orchestrator.max_async_level",
        "orchestrator.max_concurrent",
        "orchestrator.renderer.name",
        "orchestrator.train.sampling",
        "orchestrator.buffer",
        "orchestrator.train.algo",
        "orchestrator.eval.interval",
        "trainer.optim",
        "trainer.loss",
        "deployment",
        "ckpt",
    ]
    return _setting_rows(cfg, keys)


def _setting_rows(cfg: dict[str, Any], keys: list[str]) -> list[tuple[str, Any]]:
    """(dotted key, value) rows of the ``keys`` the resolved config sets; tables and lists as sorted JSON."""
    rows = [
        (k, json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
        for k in keys
        if (v := dotted(cfg, k)) is not None
    ]
    return rows or [("resolved config", "not available")]


def _sft_settings(cfg: dict[str, Any]) -> list[tuple[str, Any]]:
    """Section 2 of an SFT run, from its ``sft.json``: the launch view's RL fields (group size, sampling, loss,
    orchestrator batch size) are placeholders there and would misreport the run."""
    keys = [
        "model.name",
        "max_steps",
        "seed",
        "data.name",
        "data.batch_size",
        "data.seq_len",
        "data.shuffle",
        "data.columns",
        "loss_mask",
        "val",
        "renderer.name",
        "eval.interval",
        "trainer.optim",
        "trainer.scheduler",
        "trainer.micro_batch_size",
        "trainer.model.lora",
        "deployment",
        "ckpt",
    ]
    return _setting_rows(cfg, keys)


def _env_rows(cfg: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for split in ("train", "eval"):
        for e in dotted(cfg, f"orchestrator.{split}.env", []) or []:
            if not isinstance(e, dict):
                continue
            rows.append(
                {
                    "split": split,
                    "name": e.get("name"),
                    "taskset": dotted(e, "taskset.id", e.get("id")),
                    "taskset split": dotted(e, "taskset.split"),
                    "harness": dotted(e, "harness.id"),
                    "runtime": dotted(e, "harness.runtime.type"),
                    "ratio": e.get("ratio"),
                    "group_size": e.get("group_size"),
                    "num_examples": e.get("num_examples"),
                    "max_turns": e.get("max_turns"),
                    "max_total_tokens": e.get("max_total_tokens"),
                    "timeout": json.dumps(e.get("timeout"), sort_keys=True) if e.get("timeout") else None,
                }
            )
    return pd.DataFrame(rows).astype(object).where(lambda d: d.notna(), "") if rows else pd.DataFrame()


def _validation(doc: _Doc, run: RunData, key: Any) -> None:

    found = False
    for name, verdict in read_verdicts(run.run).items():
        doc.para(f"First-run gate `srl eval {name}`: {'PASSED' if verdict.passed else 'FAILED'}.")
        doc.table(
            pd.DataFrame(
                [{"env": i.env, "item": i.title, "status": i.status, "detail": i.detail} for i in verdict.items]
            ),
            name=key(f"gate_{name}"),
        )
        found = True
    orch = role_metrics(run.metrics, "orchestrator")
    eval_cols = [c for c in orch.columns if c.startswith("eval/")]
    if eval_cols:
        first = orch[eval_cols].dropna(how="all")
        if not first.empty:
            step0 = int(first.index.min())
            row = first.loc[step0].dropna()
            doc.para(f"Baseline eval at step {step0} (before any update when step is 0), from metrics.jsonl:")
            doc.table(pd.DataFrame({"metric": row.index, "value": row.values}))
            found = True
    if run.rollouts is not None and not run.rollouts.empty:
        ev = run.rollouts[run.rollouts["kind"].astype(str) == "eval"]
        if not ev.empty:
            first_step = int(ev["step"].min())
            summ = env_summary(ev[ev["step"] == first_step])
            doc.para(f"Eval rollouts in the store at step {first_step}:")
            doc.table(summ, name=key("baseline_eval"))
            found = True
    if not found:
        doc.para(
            "No baseline eval recorded. Validate the taskset and its scoring before training: "
            "run `srl eval validate` and `srl eval run`, and keep periodic eval with a step-0 baseline."
        )


def _samples(doc: _Doc, run: RunData, key: Any) -> None:
    """Sample rollouts per (kind, env) from the store: best, worst and a truncated one of the newest step."""
    picks = samples_mod.pick_samples(run.rollouts)
    if picks.empty:
        return
    doc.heading("Sample rollouts", 4)
    model = dotted(run.config, "model.name")
    shown = samples_mod.sample_texts(run.run.rollout_store, picks, model)
    if samples_mod.decoder(model) is None:
        doc.para(f"The tokenizer of model {model!r} was not found: prompts and completions are shown as token ids.")
    doc.para(
        "Per env and kind, at its newest step: the valid rollout with the highest reward, the one with the "
        "lowest, and a truncated one (cut by a length limit). Prompts show their end, completions their start."
    )
    cols = [
        "kind",
        "env",
        "which",
        "step",
        "reward",
        "truncated",
        "truncation_reason",
        "completion_len",
        "prompt",
        "completion",
    ]
    doc.table(shown[cols], name=key("samples"))


def _stable_broadcasts(run: RunData) -> list[Path]:
    """The run's complete weight broadcasts (STABLE marker present), newest first."""
    dirs = [run.run.broadcast_step(s) for s in reversed(numbered_steps(run.run.broadcasts))]
    return [d for d in dirs if (d / STABLE_MARKER).exists()]


def _wall_seconds(run: RunData) -> float | None:
    """Seconds from the run's first start to its last record (gaps between attempts included).

    The start is the earliest of: the first metrics or store record, the local launcher's ``started``
    (``launcher/local.json``), and each Slurm job's start (``launcher/job-<id>.env``, written by the batch script
    when the job starts). Without the starts, engine start-up (minutes) would be left out of the GPU-hours."""
    times: list[float] = []
    if "time" in run.metrics.columns and run.metrics["time"].notna().any():
        t = run.metrics["time"].astype(float)
        times += [float(t.min()), float(t.max())]
    if run.rollouts is not None and "time" in run.rollouts.columns and len(run.rollouts):
        times += [float(run.rollouts["time"].min()), float(run.rollouts["time"].max())]
    starts: list[float] = []
    local = read_local_record(run.run) or {}
    for key, into in (("started", starts), ("ended", times)):
        try:
            into.append(float(local[key]))
        except (KeyError, TypeError, ValueError):
            pass
    for env_file in run.run.launcher.glob("job-*.env"):
        try:
            starts.append(env_file.stat().st_mtime)
        except OSError:
            pass
    if times and starts:
        times.append(min(starts))
    return (max(times) - min(times)) if len(times) >= 2 else None


def _num_train_steps(run: RunData) -> int | None:
    if run.rollouts is None or run.rollouts.empty:
        return None
    return int(run.rollouts.loc[run.rollouts["kind"].astype(str) == "train", "step"].nunique()) or None


def _monitor_table(metrics: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for role, col in MONITORED:
        data = role_metrics(metrics, role)
        if col not in data.columns:
            continue
        s = data[col].astype(float).dropna()
        if s.empty:
            continue
        rows.append(
            {
                "role": role,
                "metric": col,
                "first": s.iloc[0],
                "last": s.iloc[-1],
                "min": s.min(),
                "max": s.max(),
                "last step": int(s.index[-1]),
            }
        )
    if not rows:
        return pd.DataFrame({"metric": ["(no metrics recorded)"]})
    return pd.DataFrame(rows)


def _stop_criteria(doc: _Doc, run: RunData, steps: pd.DataFrame | None) -> None:
    """Configured ``[monitors.stop]`` and, replayed over this run's metrics, whether and when they tripped."""
    table = dotted(run.config, "monitors.stop")
    if not table:
        doc.para(
            "Stop criteria ([monitors.stop]): none configured. Watch the errored/truncated shares, effective "
            "batch size, mismatch KL and entropy above, and stop on a sustained change."
        )
        return
    doc.para("Stop criteria ([monitors.stop]): " + json.dumps(table, sort_keys=True))
    try:
        criteria = criteria_from_table(table)
    except (TypeError, ValueError) as exc:
        doc.para(f"Cannot evaluate them: {exc}")
        return
    per_step: dict[int, dict[str, float]] = {}
    for role in ("orchestrator", "trainer"):
        data = role_metrics(run.metrics, role)
        for step, row in data.iterrows():
            per_step.setdefault(int(step), {}).update({k: v for k, v in row.items() if pd.notna(v)})
    if steps is not None and not steps.empty:  # the store knows each step's errored share exactly
        d = steps[(steps["kind"] == "train") & (steps["env"] == ALL_ENVS)]
        for step, share in zip(d["step"], d["errored_rate"]):
            per_step.setdefault(int(step), {}).setdefault("errored_share", float(share))
    tripped = replay(criteria, sorted(per_step.items()))
    doc.para(
        f"Replayed over this run's metrics: tripped at {tripped[1]}."
        if tripped
        else "Replayed over this run's metrics: not tripped."
    )


# -- sweeps -------------------------------------------------------------------------------------------------------


def _point_label(meta: dict[str, Any]) -> str:
    point = {k: v for k, v in (meta.get("sweep_point") or {}).items() if k != "seed"}
    return ", ".join(f"{k}={v}" for k, v in sorted(point.items())) or "(default)"


def _run_curve(run: RunData, metric: str) -> pd.Series:
    orch = role_metrics(run.metrics, "orchestrator")
    if metric in orch.columns:
        return orch[metric].astype(float).dropna()
    if metric == SWEEP_METRIC and run.rollouts is not None and not run.rollouts.empty:
        steps = step_summary(run.rollouts)
        d = steps[(steps["kind"] == "train") & (steps["env"] == ALL_ENVS)]
        return d.set_index("step")["reward_mean"].astype(float)
    return pd.Series(dtype=float)


def sweep_table(runs: list[RunData], metrics: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table, curves) of a sweep. ``table``: one row per (point, metric) with ``seeds``, ``final_mean``,
    ``final_low``/``final_high`` (95% t-interval across seeds of each run's last value) and the same for ``best``
    (each run's maximum). ``curves``: point, seed, run, metric, step, value.
    """
    if metrics is None:
        names = {SWEEP_METRIC}
        for r in runs:
            names |= {c for c in role_metrics(r.metrics, "orchestrator").columns if is_eval_score(c)}
        metrics = sorted(names)
    rows, curves = [], []
    for r in runs:
        for m in metrics:
            s = _run_curve(r, m)
            if s.empty:
                continue
            seed = (r.meta.get("sweep_point") or {}).get("seed", r.meta.get("seed"))
            curves.append(
                pd.DataFrame(
                    {
                        "point": _point_label(r.meta),
                        "seed": seed,
                        "run": r.name,
                        "metric": m,
                        "step": s.index.astype(int),
                        "value": s.values,
                    }
                )
            )
    curves_df = (
        pd.concat(curves, ignore_index=True)
        if curves
        else pd.DataFrame(columns=["point", "seed", "run", "metric", "step", "value"])
    )
    for (point, m), d in curves_df.groupby(["point", "metric"], sort=True):
        per_run = d.sort_values("step").groupby("run")["value"]
        final, best = per_run.last(), per_run.max()
        fm, fl, fh = t_interval(final.to_numpy())
        bm, bl, bh = t_interval(best.to_numpy())
        rows.append(
            {
                "point": point,
                "metric": m,
                "seeds": len(final),
                "final_mean": fm,
                "final_low": fl,
                "final_high": fh,
                "best_mean": bm,
                "best_low": bl,
                "best_high": bh,
            }
        )
    return pd.DataFrame(rows), curves_df


def _sweep_section(doc: _Doc, runs: list[RunData]) -> None:
    doc.heading("Sweep", 2)
    manifest = pd.DataFrame(
        [
            {
                "run": r.name,
                "point": _point_label(r.meta),
                "seed": (r.meta.get("sweep_point") or {}).get("seed", r.meta.get("seed")),
                "array_index": r.meta.get("array_task_id", r.meta.get("sweep_index")),
                # The array task as Slurm names it (its log is <logs>/%x_<array job>_<task>.out).
                "array_task": (
                    f"{r.meta['array_job_id']}_{r.meta.get('array_task_id')}" if r.meta.get("array_job_id") else None
                ),
            }
            for r in runs
        ]
    )
    doc.table(manifest, name="sweep_runs")
    table, curves = sweep_table(runs)
    if table.empty:
        doc.para("No sweep metrics recorded yet.")
        return
    doc.para(
        "Final = each run's last value; best = each run's maximum; mean and 95% Student-t interval across "
        "seeds of the same point (no interval with one seed)."
    )
    doc.table(table, name="sweep")
    # The held-out scores first (avg@k before pass@k), then the train reward.
    scores = sorted((m for m in table["metric"].unique() if is_eval_score(m)), key=lambda m: ("/pass@" in m, m))
    for metric in scores[: MAX_SWEEP_FIGURES - 1] + [SWEEP_METRIC]:
        sub = table[table["metric"] == metric]
        fig = fig_sweep(
            curves[curves["metric"] == metric],
            sub.rename(columns={"final_mean": "mean", "final_low": "low", "final_high": "high"}),
            metric,
        )
        if fig is not None:
            doc.figure("sweep_" + _safe(metric), fig)


_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table.tbl{border-collapse:collapse;font-size:12px;margin:0.5em 0}
table.tbl td,table.tbl th{border:1px solid #ccc;padding:2px 6px;text-align:right}
pre{background:#f6f6f6;padding:0.6em;overflow-x:auto;font-size:12px}
div.scroll{max-width:100%;overflow-x:auto}
figure{margin:0.5em 0}
figure img{max-width:100%}
section.outcome{border:1px solid #ccc;padding:0 1em;margin:0.5em 0 1em}
section.outcome h3{margin:0.5em 0}
div.figrow{display:flex;gap:1em}
div.figrow figure{flex:1 1 0;min-width:0}"""


def _write(doc: _Doc, title: str) -> None:
    from toolkit.fsutil import atomic_write_text

    page = (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(doc.html) + "\n</body></html>\n"
    )
    atomic_write_text(doc.paths.html, page)
    atomic_write_text(doc.paths.markdown, "\n".join(doc.md) + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.report RUN_DIR... [--out DIR] [--no-run-figures]``: write the report (default
    ``<first run>/reports``)."""
    import argparse
    import sys

    from toolkit.run.layout import RunDir

    parser = argparse.ArgumentParser(prog="srl report", description="Offline report of one or more runs.")
    parser.add_argument("run_dirs", type=Path, nargs="+", help="run directories, or a sweep root (all its points)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-run-figures", action="store_true", help="skip per-run figures (large sweeps)")
    args = parser.parse_args(argv)
    out = args.out or RunDir(args.run_dirs[0]).reports
    try:
        paths = build_report(args.run_dirs, out, run_figures=not args.no_run_figures)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out names a file, or a place where nothing can be created
        why = exc.strerror or exc
        print(f"error: cannot write the report into {out}: {why}; give --out a directory", file=sys.stderr)
        return 2
    print(f"wrote {paths.html}\nwrote {paths.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
