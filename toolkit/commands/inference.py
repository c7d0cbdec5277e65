"""``srl inference``: serve a model on its own (engines + router), locally or as a Slurm job.

    srl inference @ jobs/serve/tiny.toml [--section.field VALUE ...] [--dry-run] [--site local-slurm]
    srl inference queues RUN_DIR        # waiting requests per engine role: which side of P/D to grow

The deployment publishes ``<run>/control/inference_ready.json`` (base URL, router, engines), so RL or eval jobs
started with ``inference.external = <run dir>`` use it. Locally it serves until Ctrl-C.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import load_config
from ..config.errors import ConfigError
from ..preflight import preflight


def main(argv: list[str]) -> int:
    if argv and argv[0] == "queues":
        return _queues(argv[1:])
    from ..cli import _print_warnings
    from ..config.cli_args import split_config_args

    files, overrides, flags = split_config_args(argv)
    if flags["help"] or not files:
        print(__doc__)
        return 0 if flags["help"] else 2
    checked = preflight(load_config(files, overrides, purpose="serve"))
    loaded, site = checked.loaded, checked.site
    _print_warnings(checked)
    cfg = loaded.config
    from ..launch.prepare import prepare_attempt, run_dir_for
    from ..placement.plan import build_plan, run_port_key, write_plan

    # A dry run never touches a deployment that exists (it may be serving: other runs read its placement, ready
    # file and admin token), let alone deletes it for --clean.
    run, attempt = prepare_attempt(loaded, run_dir_for(loaded, resume=flags["resume"]),
                                   argv=["srl", "inference", *argv], dry_run=flags["dry_run"],
                                   resume=flags["resume"], clean=flags["clean"])  # fmt: skip
    if site.is_slurm:
        plan = build_plan(cfg, site, run, job_id="$SLURM_JOB_ID", roles=("inference", "router"),
                          port_key=run_port_key(cfg))
    else:
        from ..launch.dispatch import local_plan

        plan = local_plan(cfg, site, run, probe=not flags["dry_run"], roles=("inference", "router"))
    write_plan(run, plan)
    if site.is_slurm:
        from ..launch.submit import submit_job
        from ..render import render_job

        if flags["dry_run"]:
            print(f"dry run: {render_job(cfg, run, plan, 'inference')}")
            return 0
        job_id = submit_job(cfg, run, attempt, "inference", site=site, plan=plan)
        print(f"submitted inference job {job_id}; ready file {run.inference_ready}")
        return 0
    if flags["dry_run"]:
        print(f"dry run: placement {run.placement_file}")
        return 0
    from ..launch.local import run_local

    print("srl: serving until Ctrl-C")
    return run_local(cfg, run, plan, attempt=attempt)


def _queues(argv: list[str]) -> int:
    from ..config.cli_args import print_help_if_asked

    usage = "usage: srl inference queues RUN_DIR"
    if print_help_if_asked(argv, usage + "\n\nPrints the waiting requests per engine role of a running deployment "
                           "(JSON): which side\nof prefill/decode to grow."):
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
