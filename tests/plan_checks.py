"""Comparing placements of one run across its dry run, its submission and its started job (the plan tests share
it)."""

from __future__ import annotations

import json


def without_job(plan: dict, job_id: str | None = None) -> dict:
    """A placement.json dict with its job id, hosts, addresses and model path (what the job fills in) left out, so two
    placements of one run compare equal.

    Before the job id is known, values holding it name ``$SLURM_JOB_ID`` and are marked for expansion on the node
    (``node_expand``); that marking goes too. ``job_id``: the started job's id, put in place of those placeholders
    so that a dry run's placement compares with the job's. (Replacing the real id in the job's placement instead
    breaks on a short id: job 8 turned port 28616 into "2<job id>616".)
    """
    kept = {k: v for k, v in plan.items() if k not in ("job_id", "hosts", "addresses", "model_path")}
    text = json.dumps(kept, sort_keys=True)
    if job_id is not None and plan["job_id"] == "$SLURM_JOB_ID":
        text = text.replace("$SLURM_JOB_ID", job_id)
    out = json.loads(text)
    for p in out["processes"]:
        p.pop("node_expand")
    return out
