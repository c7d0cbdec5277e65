"""The ``srl`` command line.

Login-node commands (``rl``, ``config``, ``status``, ``cancel``, ``logs``, ``sweep``, ``report``, ``diagnose``)
import no torch or vllm: each command imports what it needs inside its own function, so ``srl --help`` and
``srl rl ... --dry-run`` start in a fraction of a second. Role entrypoints (``trainer``, ``orchestrator``,
``inference``) run on compute nodes and import their heavy libraries there.

Config errors exit with status 2 and a message naming the file and field; never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig
    from toolkit.preflight import Preflight
    from toolkit.run.layout import RunDir


USAGE = """usage: srl <command> [...]

RL runs
  srl rl @ run.toml [@ overlay.toml ...] [--section.field VALUE ...] [--dry-run] [--resume] [--clean]
         [--start-soonest]
  srl config show @ run.toml [...]      print the resolved (canonical) config as TOML
  srl config convert FILE               print FILE converted to the canonical shape
  srl status [RUN_DIR]                  a run's progress; without RUN_DIR, every run under outputs/
  srl cancel RUN_DIR | srl logs RUN_DIR [--role R] [--follow]   (--follow ends when the run ends)

Supervised fine-tuning
  srl sft @ sft.toml [@ overlay.toml ...] [--section.field VALUE ...] [--dry-run] [--resume] [--clean]
  srl sft make-data OUT.jsonl @ rl.toml [--env NAME] [--taskset.FIELD VALUE ...]   SFT rows from reference answers
  srl sft chain @ sft.toml [...] --then @ rl.toml [...]   SFT, then RL from its final model (Slurm: afterok)

Environments, evals, sweeps, reports
  srl eval validate @ run.toml          model-free checks of every taskset and verifier
  srl eval run @ run.toml -n 20 -r 4    first-run gate against a live endpoint
  srl sweep @ sweep.toml [@ overlay.toml ...] [--section.field VALUE ...] [--dry-run] [--resume] [--clean]
                                        parameter sweep: every point an srl rl job in a Slurm array task sized to it
  srl report RUN_DIR [...]              HTML + Markdown report (pandas, matplotlib)
  srl diagnose RUN_DIR                  name why a run failed, with its evidence
  srl export RUN_DIR [--step N] DIR     a checkpoint as a Hugging Face model directory (LoRA merged)

Models and roles
  srl model build-tiny DIR [--seed N] | srl model import-smollm2 DIR
  srl inference @ serve.toml            serve a model (standalone) | srl inference queues RUN_DIR
  srl inference join RUN_DIR [--count K]   more inference replicas for a running run ([deployment.elastic])
  srl trainer --run-dir DIR | srl orchestrator --run-dir DIR   (started by the launchers)

`srl rl --help` lists every config field with its meaning and default.
"""

# Commands whose implementation lives elsewhere: "module:function", imported only when called.
_ROLE_COMMANDS = {
    "trainer": "toolkit.trainer.main:main",
    "orchestrator": "toolkit.orchestrator.main:main",
    "inference": "toolkit.commands.inference:main",
    "sweep": "toolkit.sweep:main",
    "report": "analysis.report:main",
    "diagnose": "analysis.diagnose:main",
    "eval": "toolkit.evalgate:main",
    "status": "toolkit.launch.control:status_main",
    "cancel": "toolkit.launch.control:cancel_main",
    "logs": "toolkit.launch.control:logs_main",
    "model": "toolkit.models.cli:main",
    "sft": "toolkit.commands.sft:main",
    "export": "toolkit.commands.export:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, args = argv[0], argv[1:]
    from .config.errors import ConfigError
    from .launch.slurm import SubmitError

    try:
        if cmd == "rl":
            return cmd_rl(args, argv)
        if cmd == "config":
            return cmd_config(args)
        if cmd in _ROLE_COMMANDS:
            module, func = _ROLE_COMMANDS[cmd].split(":")
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as e:
                print(f"srl {cmd}: not available in this installation ({e.name} is missing)", file=sys.stderr)
                return 2
            return int(getattr(mod, func)(args) or 0)
    except ConfigError as e:
        print(f"srl {cmd}: {e.render()}", file=sys.stderr)
        return 2
    except SubmitError as e:
        from .launch.submit import nothing_queued

        then = (
            (
                "nothing was queued; once Slurm accepts jobs, the same command starts the run again in the same run "
                "directory"
            )
            if nothing_queued(e)
            else ("the job may have been queued anyway: check `squeue --me` before running the command again")
        )
        print(f"srl {cmd}: Slurm did not take the job: {e}\n  {then}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the reader left: not an error. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    print(f"srl: unknown command '{cmd}'\n\n{USAGE}", file=sys.stderr)
    return 2


def resume_changes(previous: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted config fields whose value differs between the run's last resolved config (``previous``, the
    ``rl.json`` of its latest attempt) and the one a ``--resume`` is about to use (``current``), as
    ``"field: old -> new"``, sorted. Both are ``RLConfig.model_dump(mode="json")`` dicts."""
    out: list[str] = []
    for key in sorted(set(previous) | set(current)):
        a, b = previous.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += resume_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def _note_resume_changes(run: RunDir, cfg: RLConfig) -> None:
    """A resume takes its config from this command line, not from the run: print what differs from the run's last
    attempt (an override not repeated falls back to the job file's value), so it is a choice, not a surprise."""
    import json

    try:
        previous = json.loads(run.resolved("rl").read_text())
    except (OSError, ValueError):
        return
    changes = resume_changes(previous, cfg.model_dump(mode="json"))
    if changes:
        shown = changes[:20] + ([f"... and {len(changes) - 20} more"] if len(changes) > 20 else [])
        print(
            "note: --resume: the config differs from the run's last attempt (overrides are not carried over; "
            "repeat them to keep them):\n  " + "\n  ".join(shown),
            file=sys.stderr,
        )


def _refuse_resume_of_finished_run(run: RunDir, cfg: RLConfig) -> None:
    """``--resume`` of a run whose resume point already is its last step would start every component only to stop
    again: say so instead (ConfigError), before anything is written or started."""
    from .checkpoints import latest_complete
    from .config import ConfigError

    step = cfg.resume.step if cfg.resume.step is not None else latest_complete(run)
    if step is not None and step >= cfg.max_steps:
        raise ConfigError(
            f"--resume: {run.root} already finished (checkpoint step {step} is complete, max_steps = {cfg.max_steps}); "
            f"nothing to resume. To train on, raise max_steps (e.g. --max-steps {cfg.max_steps * 2}); to start over, "
            "use --clean."
        )


def cmd_rl(args: list[str], full_argv: list[str], *, dependency: str | None = None) -> int:
    """``srl rl``: validate, write the run directory, then launch locally or submit to Slurm (behind
    ``dependency``, e.g. ``afterok:<job>``, when given: ``srl sft chain``)."""
    from .config import ConfigError, load_config
    from .config.cli_args import split_config_args
    from .launch.pipeline import Launch, start
    from .launch.prepare import RESUME_CLEAN_MSG, run_dir_for

    files, overrides, flags = split_config_args(args, start_soonest=True)
    if flags["help"]:
        from .config.schema_help import schema_help

        print(schema_help())
        return 0
    if not files:
        raise ConfigError("give at least one config file: srl rl @ jobs/reverse-text/rl.toml")
    if flags["resume"] and flags["clean"]:  # before the configs are even read
        raise ConfigError(RESUME_CLEAN_MSG)
    loaded = load_config(files, overrides)
    live = run_dir_for(loaded, resume=flags["resume"])
    if flags["start_soonest"]:
        from .launch.queue import choose_soonest
        from .placement.plan import roles_of
        from .preflight.site import load_site

        loaded = choose_soonest(loaded, load_site(loaded.config.site), live, roles=roles_of("rl"))

    def refuse(checked: Preflight) -> None:
        if flags["resume"] and live.configs.exists():
            _note_resume_changes(live, checked.config)  # as it will be written: preflight's notes included
            if not flags["dry_run"]:
                _refuse_resume_of_finished_run(live, checked.config)

    req = Launch(
        loaded,
        live,
        argv=["srl", *full_argv],
        dry_run=flags["dry_run"],
        resume=flags["resume"],
        clean=flags["clean"],
        dependency=dependency,
        start_estimates=not flags["start_soonest"],
    )
    started = start(req, before_prepare=refuse)
    elastic = getattr(req.loaded.config.deployment, "elastic", None)
    if started.job_id and elastic is not None and elastic.replicas:
        from .launch.replicas import join

        jobs = join(
            started.run,
            count=elastic.replicas,
            partition=None,
            time=None,
            argv=["srl", *full_argv],
            dependency=f"after:{started.job_id}",
        )
        print(f"submitted replica job(s) {', '.join(jobs)}; they start with job {started.job_id} and join the run")
    return started.status


def cmd_config(args: list[str]) -> int:
    """``srl config show @ ...`` and ``srl config convert FILE``."""
    import tomli_w

    from .config import ConfigError, load_config, toml_data
    from .config.cli_args import print_help_if_asked, split_config_args
    from .launch.pipeline import print_findings
    from .preflight import preflight

    usage = (
        "usage: srl config show @ run.toml [...]    print the resolved (canonical) config as TOML\n"
        "       srl config convert FILE             print FILE converted to the canonical shape"
    )
    if print_help_if_asked(args, usage):
        return 0
    if not args or args[0] not in ("show", "convert"):
        raise ConfigError(usage)
    if args[0] == "show":
        files, overrides, _ = split_config_args(args[1:])
        loaded = preflight(load_config(files, overrides))
    else:
        if len(args) != 2:
            raise ConfigError("usage: srl config convert FILE")
        loaded = preflight(load_config([Path(args[1])]))
    print_findings(loaded)
    print(tomli_w.dumps(toml_data(loaded.config)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
