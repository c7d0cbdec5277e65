"""``srl sft``: supervised fine-tuning runs, their data, and the SFT -> RL chain.

    srl sft @ sft.toml [@ overlay.toml ...] [--section.field VALUE ...] [--dry-run] [--resume] [--clean]
    srl sft make-data OUT.jsonl @ rl.toml [--env NAME] [--taskset.FIELD VALUE ...]
    srl sft chain @ sft.toml [...] --then @ rl.toml [...]

An SFT run is prepared, placed, launched (locally, or as one Slurm job) and followed (``srl status/logs/cancel``)
like an RL run whose only role is the trainer; its run directory ends with ``model/`` (the final weights as a
Hugging Face directory), which ``srl rl`` accepts as ``model.name`` (the run directory itself works too).

``chain`` submits the SFT job and the RL job behind it (``--dependency=afterok``) on a Slurm site, the RL run's
``model.name`` set to the SFT run directory; locally it runs them one after the other and starts RL only when SFT
finished. Login-node code: no torch, no vllm.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.config import LoadedConfig, RLConfig
    from toolkit.config.sft import SFTConfig
    from toolkit.launch.pipeline import Check, Launch, Started
    from toolkit.preflight import Preflight
    from toolkit.run.layout import RunDir


def load(files: list[Path], overrides: list[str]) -> SFTConfig:
    """The validated SFTConfig, its datasets checked on this machine and its launch view through preflight (model,
    site, ports, placement, [eval] tasksets), as ``srl sft`` checks it before anything is written.

    Raises ConfigError naming the field, or the dataset file, row and column of a bad sample.
    """
    cfg = _read(files, overrides)
    _checks(cfg)(_launch_loaded(cfg, files))
    return cfg


def _read(files: list[Path], overrides: list[str]) -> SFTConfig:
    """The validated SFTConfig (schema and cross-field rules), its dataset paths made absolute. Raises ConfigError
    naming the field."""
    from toolkit.config import ConfigError
    from toolkit.config.sft import load_sft_config

    if not files:
        raise ConfigError("give at least one config file: srl sft @ jobs/reverse-text/sft.toml")
    cfg = load_sft_config(files, overrides)
    # Relative dataset paths mean "from here": the trainer runs elsewhere (a Slurm job's directory, another node).
    cfg.data.name = cfg.data.name.expanduser().absolute()
    if cfg.val is not None and cfg.val.data is not None:
        cfg.val.data.name = cfg.val.data.name.expanduser().absolute()
    return cfg


def _checks(cfg: SFTConfig) -> Check:
    """The launch pipeline's check of SFT run ``cfg``: preflight of its launch view (:func:`_check_world`), then its
    datasets on this machine (:func:`_check_data`). Returns the Preflight."""

    def check(loaded: LoadedConfig, **kw: Any) -> Preflight:
        checked = _check_world(loaded, **kw)
        _check_data(cfg)
        return checked

    return check


def _check_data(cfg: SFTConfig) -> None:
    """Every dataset of ``cfg`` read on this machine. Raises ConfigError naming the field, or the dataset file, row
    and column of a bad sample."""
    from toolkit.config import ConfigError, ConfigIssue
    from toolkit.trainer.sft_data import DataError, check_dataset

    checks = [("data.name", cfg.data)] + ([("val.data.name", cfg.val.data)] if cfg.val and cfg.val.data else [])
    for field, section in checks:
        try:
            rows = check_dataset(section.name, section.columns, cfg.loss_mask)
        except DataError as e:
            raise ConfigError([ConfigIssue(field, str(e))]) from None
        # The trainer holds val.fraction of the rows out; with one row there is nothing left to train on, and
        # finding that out in the trainer (after the job queued and the model loaded) is too late.
        if field == "data.name" and cfg.val is not None and cfg.val.data is None and rows < 2:
            raise ConfigError(
                [
                    ConfigIssue(
                        "val.fraction",
                        f"{section.name} has {rows} row; holding out "
                        "val.fraction of it leaves nothing to train on; give [val.data], more "
                        "rows, or drop [val]",
                    )
                ]
            )


def _launch_loaded(cfg: SFTConfig, files: list[Path]) -> LoadedConfig:
    """The SFT run's launch view as the LoadedConfig the launch pipeline checks and writes."""
    from toolkit.config.sft import launch_loaded

    loaded = launch_loaded(cfg)
    loaded.inputs = [Path(f) for f in files]
    return loaded


def _check_world(
    loaded: LoadedConfig, *, run: RunDir | None = None, roles: tuple[str, ...] = ("trainer",), probe: bool = False
) -> Preflight:
    """The preflight ``srl rl`` runs (model.name, site, ports, placement, [eval] tasksets and runtimes), on the SFT
    run's launch view ``loaded`` (a writable output_dir among them): a missing model or an unknown site is reported
    here, before the run directory is written, instead of as a traceback when the trainer starts. Prints notes
    and warnings; returns the Preflight; raises ConfigError naming the SFT config's fields."""
    from toolkit.config import ConfigError
    from toolkit.config.sft import in_sft_terms
    from toolkit.launch.pipeline import print_findings
    from toolkit.preflight import preflight

    try:
        checked = preflight(loaded, run=run, roles=roles, probe=probe)
    except ConfigError as e:
        raise ConfigError(in_sft_terms(e.issues)) from None
    print_findings(checked, in_sft_terms(checked.warnings))
    return checked


def _run_dir(cfg: SFTConfig, resume: bool) -> RunDir:
    """The run directory: ``run.name``, or a new ``sft--<data>--<model>--<id>`` (with ``resume``: the newest run of
    that prefix that recorded metrics)."""
    from toolkit.run.layout import RunDir

    if cfg.run.name is None:
        raw = f"sft--{Path(cfg.data.name).stem}--{Path(cfg.model.name).name or 'model'}"
        prefix = re.sub(r"[^A-Za-z0-9._+-]", "-", raw)[:110] + "--"
        name = prefix + uuid.uuid4().hex[:6]
        if resume:
            runs = sorted(
                (p for p in Path(cfg.output_dir).glob(prefix + "*") if RunDir(p).metrics.exists()),
                key=lambda p: RunDir(p).metrics.stat().st_mtime,
            )
            if runs:
                name = runs[-1].name
                print(f"srl: --resume without run.name: continuing {runs[-1]}", file=sys.stderr)
        cfg.run.name = name
    return RunDir(Path(cfg.output_dir) / cfg.run.name)


def _refuse_finished(cfg: SFTConfig, live: RunDir, *, resume: bool, dry_run: bool) -> None:
    """``--resume`` of an SFT run whose last checkpoint is already at max_steps: ConfigError, nothing written."""
    from toolkit import checkpoints
    from toolkit.config import ConfigError
    from toolkit.trainer.sft import PARTS

    if resume and not dry_run and live.configs.exists():
        step = cfg.resume.step or checkpoints.latest_complete(live, PARTS)
        if step is not None and step >= cfg.max_steps:
            raise ConfigError(
                f"--resume: {live.root} already finished (checkpoint step {step}, max_steps = "
                f"{cfg.max_steps}); raise max_steps to train on, or use --clean to start over"
            )


def _write_sft_config(cfg: SFTConfig, run: RunDir, attempt: int) -> None:
    """``configs/attempt_<n>/resolved/sft.json``: marks the run as SFT for the trainer, which reads it."""
    from toolkit.fsutil import atomic_write_json

    atomic_write_json(run.config_attempt(attempt) / "resolved" / "sft.json", cfg.model_dump(mode="json"))


def _request(cfg: SFTConfig, files: list[Path], argv: list[str], flags: dict[str, Any]) -> Launch:
    """The launch pipeline's request for SFT run ``cfg`` (its run directory decided here)."""
    from toolkit.launch.pipeline import Launch

    live = _run_dir(cfg, flags["resume"])
    return Launch(
        _launch_loaded(cfg, files),
        live,
        argv=["srl", *argv],
        dry_run=flags["dry_run"],
        resume=flags["resume"],
        clean=flags["clean"],
        roles=cfg.roles(),
    )


def _start(cfg: SFTConfig, req: Launch) -> Started:
    """Start SFT request ``req`` through the launch pipeline (SFT's own checks and files as its hooks)."""
    from toolkit.launch.pipeline import start

    def after(run: RunDir, attempt: int) -> None:
        _write_sft_config(cfg, run, attempt)
        if req.dry_run:
            print(f"dry run: SFT config {run.resolved('sft')}")

    return start(
        req,
        check=_checks(cfg),
        before_prepare=lambda _: _refuse_finished(cfg, req.live, resume=req.resume, dry_run=req.dry_run),
        after_prepare=after,
    )


def prepare(
    cfg: SFTConfig, argv: list[str], *, files: list[Path], dry_run: bool, resume: bool, clean: bool
) -> tuple[RLConfig, RunDir, int]:
    """Create or reopen the run directory and write this attempt's configs, without launching (a test that is the
    run's supervisor itself). Returns ``(launch_view, run, attempt)``. Raises ConfigError as ``srl sft`` does."""
    from toolkit.launch.prepare import prepare_attempt

    req = _request(cfg, files, argv, {"dry_run": dry_run, "resume": resume, "clean": clean})
    _refuse_finished(cfg, req.live, resume=resume, dry_run=dry_run)
    run, attempt = prepare_attempt(req.loaded, req.live, argv=req.argv, dry_run=dry_run, resume=resume, clean=clean)
    _write_sft_config(cfg, run, attempt)
    return req.loaded.config, run, attempt


def cmd_run(args: list[str]) -> int:
    """``srl sft @ ...``: validate, prepare the run directory, launch or submit."""
    from toolkit.config.cli_args import split_config_args

    files, overrides, flags = split_config_args(args)
    if flags["help"]:
        print(__doc__)
        return 0
    cfg = _read(files, overrides)
    started = _start(cfg, _request(cfg, files, ["sft", *args], flags))
    run = started.run
    if started.status == 0 and not flags["dry_run"] and started.job_id is None and run.model_export.exists():
        print(f"srl: final model {run.model_export} (use it with: srl rl @ rl.toml --model.name {run.root})")
        from toolkit.run import ending

        end = ending.read(run)
        if end is not None:
            print(end.line(), flush=True)  # how the run ended stays the last line
    return started.status


def _take_options(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """Split ``--env NAME`` and ``--taskset.FIELD VALUE`` pairs from the rest (files and config overrides)."""
    from toolkit.config import ConfigError

    env, fields, rest = None, {}, []
    tokens = iter(args)
    for a in tokens:
        if a != "--env" and not a.startswith("--taskset."):
            rest.append(a)
            continue
        value = next(tokens, None)
        if value is None:
            raise ConfigError(f"{a} needs a value")
        if a == "--env":
            env = value
        else:
            fields[a.removeprefix("--taskset.").replace("-", "_")] = value
    return env, fields, rest


def _check_output(out: Path) -> None:
    """Refuse an OUT path that ``srl sft`` could not read back or that cannot be written, before any task loads.

    Raises ConfigError naming the path and the fix.
    """
    from toolkit.config import ConfigError

    if out.suffix != ".jsonl":
        # The rows are JSON Lines; under another name srl sft would read them as Parquet or refuse the file.
        raise ConfigError(f"{out}: make-data writes JSON Lines; name the output file *.jsonl")
    if out.is_dir():
        raise ConfigError(f"{out}: is a directory; give a file path such as {out / 'sft.jsonl'}")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{out}: cannot be created ({parent} is not a writable directory); choose another path")


def cmd_make_data(args: list[str]) -> int:
    """``srl sft make-data OUT @ rl.toml [--env NAME] [--taskset.FIELD VALUE ...]``: a prompt/completion JSONL
    from the reference answers of a train env's taskset (the same taskset config, so the same prompts)."""
    from toolkit.config import ConfigError, load_config
    from toolkit.config.cli_args import print_help_if_asked, split_config_args
    from toolkit.config.compose import _parse_value

    usage = "usage: srl sft make-data OUT.jsonl @ rl.toml [--env NAME] [--taskset.FIELD VALUE ...]"
    if print_help_if_asked(
        args,
        usage + "\n\nWrites a prompt/completion JSONL of the reference answers of a train "
        "env's taskset\n(the RL job's own prompts), for an SFT warm-up (srl sft).",
    ):
        return 0
    if not args or args[0].startswith(("@", "-")):
        raise ConfigError(usage)
    out = Path(args[0])
    _check_output(out)
    env_name, fields, rest = _take_options(args[1:])
    files, overrides, _ = split_config_args(rest)
    if not files:
        raise ConfigError(
            "give the RL job's config: srl sft make-data OUT.jsonl @ rl.toml (its train env's "
            "taskset supplies the prompts and reference answers)"
        )
    rl_cfg = load_config(files, overrides).config
    envs = rl_cfg.orchestrator.train.env
    names = [e.env_name for e in envs]
    env = next((e for e in envs if e.env_name == env_name), None) if env_name else (envs[0] if envs else None)
    if env is None or env.taskset is None:
        raise ConfigError(f"--env: no train env {env_name!r} with a taskset; the config's train envs: {names}")
    taskset = env.taskset
    if fields:
        from pydantic import ValidationError

        from toolkit.config.errors import pydantic_issues

        try:
            taskset = type(taskset).model_validate(
                {**taskset.model_dump(), **{k: _parse_value(v) for k, v in fields.items()}}
            )
        except ValidationError as e:
            raise ConfigError(list(pydantic_issues(e, type(taskset)))) from None
    # Reference answers of the split the RL job evaluates on would make its eval measure memorisation.
    held_out = [
        e.env_name
        for e in rl_cfg.orchestrator.eval.env
        if e.taskset is not None and e.taskset.id == taskset.id and e.taskset.split == taskset.split
    ]
    if held_out:
        print(
            f"warning: eval env(s) {held_out} of this config evaluate on taskset {taskset.id!r} split "
            f"{taskset.split!r} too; SFT on these rows trains on the eval answers",
            file=sys.stderr,
        )
    from toolkit.envs.reference import NoReferenceAnswer, write_reference_dataset
    from toolkit.evalgate.validate import workers_import_path

    try:
        # The taskset is imported as the job's env workers import it: with the job's env_vars.PYTHONPATH.
        with workers_import_path(rl_cfg):
            n = write_reference_dataset(taskset, out)
    except (NoReferenceAnswer, ValueError, ImportError) as e:  # the taskset's own load errors, e.g. a bad field
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"{out}: cannot be written ({e.strerror or e}); choose another OUT path") from None
    print(f"wrote {n} rows to {out} (taskset {taskset.id}, split {taskset.split})")
    return 0


def _refuse_chain_misuse(rl_args: list[str]) -> None:
    """Raise ConfigError, before anything is read or written, for a second ``--then`` (a chain has one RL half;
    it read as an unknown config key 'then') and for ``--model.name`` in the RL half (the chain sets the RL model
    to the SFT run's final model, so the value would be silently replaced)."""
    from toolkit.config import ConfigError

    if "--then" in rl_args:
        raise ConfigError(
            "--then is given twice: a chain is one SFT run, then one RL run "
            "(srl sft chain @ sft.toml [...] --then @ rl.toml [...])"
        )
    for tok in rl_args:
        if tok.split("=", 1)[0].replace("-", "_") == "__model.name":
            raise ConfigError(
                "--then ... --model.name: the RL half of a chain starts from the SFT run's final "
                "model, so srl sets model.name itself; give the base model to the SFT half "
                "(before --then), or run srl rl on its own to start from another model"
            )


def _check_rl_args(rl_args: list[str], cfg: SFTConfig) -> None:
    """Validate the RL half of a chain before the SFT run is written or started: a mistake there would otherwise
    surface only after SFT trained (locally) or after its job was submitted (Slurm), which then runs alone.

    The SFT run's model does not exist yet, so the check stands its base model (``cfg.model.name``, the same
    architecture) in for it. Raises ConfigError naming the RL field or file.
    """
    from toolkit.config import ConfigError, load_config
    from toolkit.config.cli_args import split_config_args
    from toolkit.preflight import preflight

    files, overrides, _ = split_config_args(rl_args)
    if not files:
        raise ConfigError("--then: give the RL job's config after it: srl sft chain @ sft.toml --then @ rl.toml")
    try:
        preflight(load_config(files, [*overrides, "--model.name", str(cfg.model.name)]))
    except ConfigError as e:
        raise ConfigError([type(i)(f"--then {i.path}".strip(), i.message, i.source) for i in e.issues]) from None


def cmd_chain(args: list[str]) -> int:
    """``srl sft chain @ sft.toml [...] --then @ rl.toml [...]``: SFT, then RL from its final model."""
    from toolkit.cli import cmd_rl
    from toolkit.config import ConfigError
    from toolkit.config.cli_args import print_help_if_asked, split_config_args

    usage = "usage: srl sft chain @ sft.toml [...] --then @ rl.toml [...]"
    if print_help_if_asked(
        args,
        usage + "\n\nRuns the SFT run, then the RL run from its final model (on Slurm: "
        "two jobs, the RL one\nstarting only after the SFT one succeeded). Options before --then "
        "are srl sft's,\nafter it srl rl's (srl sft --help, srl rl --help).",
    ):
        return 0
    if "--then" not in args:
        raise ConfigError(usage)
    i = args.index("--then")
    sft_args, rl_args = args[:i], args[i + 1 :]
    _refuse_chain_misuse(rl_args)
    files, overrides, flags = split_config_args(sft_args)
    if "--dry-run" in rl_args and not flags["dry_run"]:
        # Written last on the line, it reads as "dry-run the chain", but the SFT run would train for real.
        raise ConfigError(
            "--dry-run after --then dry-runs the RL run only while SFT trains for real; put --dry-run "
            "before --then to dry-run both"
        )
    cfg = _read(files, overrides)
    _check_rl_args(rl_args, cfg)
    req = _request(cfg, files, ["sft", *sft_args], flags)
    rl_full = [*rl_args, "--model.name", str(req.live.root)]
    if flags["dry_run"]:
        rl_full.append("--dry-run")
    started = _start(cfg, req)
    if started.job_id is not None:
        print(
            f"srl: SFT job {started.job_id}; the RL job waits for it to complete (afterok) and starts from "
            f"{started.run.model_export}"
        )
        return cmd_rl(rl_full, ["rl", *rl_full], dependency=f"afterok:{started.job_id}")
    if started.status != 0:
        print(f"srl: SFT ended with status {started.status}; RL not started", file=sys.stderr)
        return int(started.status)
    return cmd_rl(rl_full, ["rl", *rl_full])


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``srl sft``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "make-data":
        return cmd_make_data(args[1:])
    if args and args[0] == "chain":
        return cmd_chain(args[1:])
    return cmd_run(args)


__all__ = ["cmd_chain", "cmd_make_data", "cmd_run", "load", "main", "prepare"]
