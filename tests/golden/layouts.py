"""Run configs of the golden layouts (issue 3) and a helper to build configs for placement/render tests.

Every config is a plain dict merged over a minimal valid run, validated with ``config_cases.validate`` (schema, rules,
preflight). Output paths are fixed (``/shared/runs``) so rendered scripts are byte-stable.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from config_cases import validate

from toolkit.config.model import RLConfig
from toolkit.placement import build_plan
from toolkit.preflight.site import load_site
from toolkit.render import build_context, render_text
from toolkit.run.layout import RunDir

BASE: dict[str, Any] = {
    "output_dir": "/shared/runs",
    "model": {"name": "tiny-qwen3"},
    "orchestrator": {"train": {"env": [{"taskset": {"id": "srl-reverse-text"}}]}},
}


def merge(a: dict, b: dict) -> dict:
    """Deep-merge ``b`` into a copy of ``a`` (tables merge, everything else replaces)."""
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def make_cfg(over: dict | None = None, **kw: Any) -> RLConfig:
    """A validated RLConfig: BASE < ``over`` < keyword tables. Raises ConfigError like ``srl rl`` would."""
    return validate(merge(merge(BASE, over or {}), kw)).config


def multi(train: int, infer: int, **dep: Any) -> dict:
    return {"type": "multi_node", "gpus_per_node": 8, "num_train_nodes": train, "num_infer_nodes": infer, **dep}


def _pd(prefill: int, decode: int) -> dict:
    return {
        "type": "disaggregated",
        "num_prefill_replicas": prefill,
        "num_decode_replicas": decode,
        "prefill_nodes_per_replica": 1,
        "decode_nodes_per_replica": 1,
    }


LAYOUTS: dict[str, dict] = {
    "single-node": {
        "run": {"name": "golden-single"},
        "deployment": {"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 4, "num_train_gpus": 4},
        "inference": {"vllm": {"tensor_parallel_size": 2}, "deployment": {"type": "single_node", "num_replicas": 2}},
    },
    "train2-infer1": {
        "run": {"name": "golden-t2i1"},
        "deployment": multi(2, 1),
        "inference": {"vllm": {"tensor_parallel_size": 8}},
        "slurm": {"secret_env_vars": ["HF_TOKEN"]},
    },
    "infer2-replicas": {
        "run": {"name": "golden-i2"},
        "deployment": multi(1, 2, num_infer_replicas=2),
        "inference": {"vllm": {"tensor_parallel_size": 2}},
    },
    "pd-3to1-agentic": {
        "run": {"name": "golden-pd31"},
        "deployment": multi(2, 8, num_infer_replicas=2),
        "inference": {"vllm": {"tensor_parallel_size": 8}, "deployment": _pd(3, 1)},
    },
    "pd-1to2": {
        "run": {"name": "golden-pd12"},
        "deployment": multi(2, 6, num_infer_replicas=2),
        "inference": {"vllm": {"tensor_parallel_size": 4}, "deployment": _pd(1, 2)},
    },
    "hetjob-orchestrator": {
        "run": {"name": "golden-het"},
        "deployment": multi(1, 1, orchestrator="own_node", orchestrator_partition="cpu"),
        "inference": {"vllm": {"tensor_parallel_size": 8}},
    },
}


SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")


def render(layout: str, site: str = "prime-intellect") -> str:
    cfg = make_cfg(LAYOUTS[layout], site=site)
    run = RunDir(cfg.output_dir / cfg.run.name)
    s = load_site(site)
    plan = build_plan(cfg, s, run, job_id="pending")
    text = render_text("rl.sbatch.j2", build_context(cfg, s, run, plan, attempt=1), plan)
    # The submitting interpreter and its directory (put first on the job's PATH) are this machine's: normalised.
    text = text.replace(sys.executable, "/opt/srl/bin/python")
    return text.replace(f"export PATH={Path(sys.executable).parent}:", "export PATH=/opt/srl/bin:")


def check_shell(texts: list[str], tmp_path: Path) -> None:
    """``bash -n`` on each rendered script, then one shellcheck run over all (warnings and errors fail)."""
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f"script{i}.sbatch"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)
        paths.append(str(path))
    proc = subprocess.run([SHELLCHECK, "-S", "warning", *paths], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
