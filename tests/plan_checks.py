"""Comparing placements of one run across its dry run, its submission and its started job (the plan tests share
it)."""

from __future__ import annotations

import json


def without_job(plan: dict) -> dict:
    """A placement.json dict with its job id and hosts left out, so two placements of one run compare equal.

    Before the job id is known, values holding it name ``$SLURM_JOB_ID`` and are marked for expansion on the node
    (``node_expand``); that marking goes with the id.
    """
    text = json.dumps({k: v for k, v in plan.items() if k not in ("job_id", "hosts", "addresses")}, sort_keys=True)
    out = json.loads(text.replace(plan["job_id"], "<job id>"))
    for p in out["processes"]:
        p.pop("node_expand")
    return out
