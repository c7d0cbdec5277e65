"""``srl inference``: serve a model on its own (engines + router), locally or as a Slurm job.

    srl inference @ jobs/serve/tiny.toml [--section.field VALUE ...] [--dry-run] [--site local-slurm]
    srl inference queues RUN_DIR        # waiting requests per engine role: which side of P/D to grow
    srl inference join RUN_DIR [--count K] [--partition P] [--time T]
                                        # more inference replicas for a running RL run ([deployment.elastic])

The deployment publishes ``<run>/control/inference_ready.json`` (base URL, router, engines), so RL or eval jobs
started with ``inference.external = <run dir>`` use it. Locally it serves until Ctrl-C.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import load_config
from ..config.errors import ConfigError


def main(argv: list[str]) -> int:
    if argv and argv[0] == "queues":
        return _queues(argv[1:])
    if argv and argv[0] == "join":
        return _join(argv[1:])
    from ..config.cli_args import split_config_args
    from ..launch.pipeline import Launch, start
    from ..launch.prepare import run_dir_for

    files, overrides, flags = split_config_args(argv)
    if flags["help"] or not files:
        print(__doc__)
        return 0 if flags["help"] else 2
    loaded = load_config(files, overrides, purpose="serve")
    # A dry run never touches a deployment that exists (it may be serving: other runs read its placement, ready
    # file and admin token), let alone deletes it for --clean: the pipeline writes it to the run's shadow.
    req = Launch(
        loaded,
        run_dir_for(loaded, resume=flags["resume"]),
        argv=["srl", "inference", *argv],
        dry_run=flags["dry_run"],
        resume=flags["resume"],
        clean=flags["clean"],
        kind="inference",
    )
    return start(req).status


def _queues(argv: list[str]) -> int:
    from ..config.cli_args import print_help_if_asked

    usage = "usage: srl inference queues RUN_DIR"
    if print_help_if_asked(
        argv,
        usage + "\n\nPrints the waiting requests per engine role of a running deployment "
        "(JSON): which side\nof prefill/decode to grow.",
    ):
        return 0
    if len(argv) != 1:
        raise ConfigError(usage)
    from ..inference.queues import run_queue_depths
    from ..run.layout import RunDir

    run = RunDir(Path(argv[0]))
    if not run.inference_ready.exists():
        print(f"srl inference queues: {run.inference_ready} not found (is the deployment up?)", file=sys.stderr)
        return 2
    try:
        depths = run_queue_depths(run)
    except ValueError as e:
        print(f"srl inference queues: {e}", file=sys.stderr)
        return 2
    print(json.dumps(depths, indent=2, sort_keys=True))
    return 0


def _join(argv: list[str]) -> int:
    """``srl inference join RUN_DIR [--count K] [--partition P] [--time T]``: replica jobs for a running run."""
    import argparse

    from ..launch.replicas import join
    from ..run.layout import RunDir

    ap = argparse.ArgumentParser(
        prog="srl inference join",
        description="Submit inference replicas that join a running RL run (it needs [deployment.elastic]): each "
        "serves the run's current policy once the orchestrator has loaded it, and may leave at any time.",
    )
    ap.add_argument("run_dir", type=Path, help="the RL run's directory")
    ap.add_argument("--count", type=int, default=1, help="replica jobs to submit (default 1)")
    ap.add_argument("--partition", help="default: deployment.elastic.partition, else slurm.partition")
    ap.add_argument("--time", help="time limit of each replica job; default: deployment.elastic.time")
    args = ap.parse_args(argv)
    jobs = join(
        RunDir(args.run_dir),
        count=args.count,
        partition=args.partition,
        time=args.time,
        argv=["srl", "inference", "join", *argv],
    )
    print(f"submitted replica job(s) {', '.join(jobs)} for {args.run_dir}; they join when their engines answer")
    return 0
