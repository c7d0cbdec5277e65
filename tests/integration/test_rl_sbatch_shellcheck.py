"""shellcheck over every golden layout and each site's render (slow: shellcheck takes seconds on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden.layouts import LAYOUTS, check_shell, make_cfg, render

from toolkit.placement import build_plan
from toolkit.preflight.site import load_site
from toolkit.render import build_context, render_text
from toolkit.run.layout import RunDir

pytestmark = pytest.mark.slow


def _other_site(site: str) -> str:
    over = dict(LAYOUTS["train2-infer1"])
    over["deployment"] = dict(over["deployment"], gpus_per_node=4)
    over["inference"] = {"vllm": {"tensor_parallel_size": 4}}
    if site == "generic-hpc":
        over["slurm"] = {"account": "proj123"}
    cfg = make_cfg(over, site=site)
    s = load_site(site)
    run = RunDir(cfg.output_dir / cfg.run.name)
    plan = build_plan(cfg, s, run, job_id="pending")
    return render_text("rl.sbatch.j2", build_context(cfg, s, run, plan, attempt=1), plan)


def test_every_render_passes_shellcheck(tmp_path: Path) -> None:
    texts = [render(layout) for layout in sorted(LAYOUTS)]
    texts += [_other_site("local-slurm"), _other_site("generic-hpc")]
    check_shell(texts, tmp_path)
