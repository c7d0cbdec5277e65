"""Rendered sbatch text: GPU request style (B01), torchrun binding (B02), signal/requeue directives (B13, B14),
secrets by name (B22), pre-run command in a file (B28), validated #SBATCH values, user templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden.layouts import LAYOUTS, make_cfg, merge

from toolkit.config import ConfigError
from toolkit.config.site import CpusSection, GpuSection
from toolkit.placement import build_plan, write_plan
from toolkit.preflight.site import load_site
from toolkit.render import RenderError, build_context, render_job, render_text, sbatch_value
from toolkit.run.layout import RunDir

PI = load_site("prime-intellect")


def rendered(over=None, site=PI, tmp: Path | None = None, **kw) -> str:
    cfg = make_cfg(
        merge(LAYOUTS["train2-infer1"], over or {}), site=site.name, **({"output_dir": str(tmp)} if tmp else {}), **kw
    )
    run = RunDir(Path(cfg.output_dir) / cfg.run.name)
    plan = build_plan(cfg, site, run, job_id="pending")
    if tmp:
        write_plan(run, plan)
        return render_job(cfg, run, plan, attempt=1, site=site).read_text()
    return render_text("rl.sbatch.j2", build_context(cfg, site, run, plan, attempt=1), plan)


def sbatch_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]


def test_b01_gres_style_with_type_is_the_only_gpu_request() -> None:
    site = PI.model_copy(update={"gpu": GpuSection(request_style="gres", gres_type="h100", gpus_per_node=8)})
    lines = sbatch_lines(rendered(site=site))
    gpu = [ln for ln in lines if "gpu" in ln]
    assert gpu == ["#SBATCH --gres=gpu:h100:8"]


def test_b01_gpus_per_node_style() -> None:
    site = PI.model_copy(update={"gpu": GpuSection(request_style="gpus-per-node", gpus_per_node=8)})
    text = rendered(site=site)
    assert [ln for ln in sbatch_lines(text) if "gpu" in ln] == ["#SBATCH --gpus-per-node=8"]
    assert "--gres" not in text and "SBATCH_GPUS" not in text


def test_b01_gpus_total_style() -> None:
    site = PI.model_copy(update={"gpu": GpuSection(request_style="gpus", gpus_per_node=8)})
    assert [ln for ln in sbatch_lines(rendered(site=site)) if "gpu" in ln] == ["#SBATCH --gpus=24"]


def test_b02_torchrun_step_one_task_per_node_never_gpus_per_task() -> None:
    from toolkit.launch.supervisor import step_argv

    text = rendered()
    assert "--gpus-per-task" not in text
    cfg = make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect")
    run = RunDir("/shared/runs/x")
    plan = build_plan(cfg, PI, run, job_id="1")
    step = " ".join(step_argv(plan, plan.process("trainer"), run, Path("/l/t.log"), python="py", container=[]))
    assert "--nodes=2 --ntasks=2 --ntasks-per-node=1" in step and "--gpus-per-task" not in step
    assert step.startswith("srun --job-name=trainer ")  # the job finds the step by name to stop it (_term_steps)
    with pytest.raises(ConfigError, match="per-task GPU binding"):
        make_cfg(
            LAYOUTS["train2-infer1"],
            site="prime-intellect",
            slurm={"extra_directives": ["--gpus-per-task=1", "--ntasks-per-node=4"]},
        )


def test_b13_signal_and_requeue_directives_and_background_wait() -> None:
    text = rendered(slurm={"time": "04:00:00", "requeue": True, "signal": "USR2", "signal_lead_s": 600})
    lines = sbatch_lines(text)
    assert "#SBATCH --signal=B:USR2@600" in lines and "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines
    # B: the signal goes to the batch shell, which is the supervisor itself (exec), so its handler runs at once.
    assert text.rstrip().splitlines()[-1].startswith('exec "$SRL_PYTHON" -m toolkit.launch.supervisor ')
    with pytest.raises(ConfigError, match="must be below the time limit"):
        make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect", slurm={"time": "00:10:00", "signal_lead_s": 600})


def test_b14_default_signal_is_usr2_and_usr1_with_nccl_warns() -> None:
    text = rendered()
    assert "--signal=B:USR2@" in text
    from config_cases import validate
    from golden.layouts import BASE

    loaded = validate(
        merge(merge(BASE, LAYOUTS["train2-infer1"]), {"site": "prime-intellect", "slurm": {"signal": "USR1"}})
    )
    assert any("NCCL" in w.message for w in loaded.warnings)
    text = rendered(slurm={"signal": "USR1"})
    assert "--signal=B:USR1@" in text
    cfg = make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect", slurm={"signal": "USR1"})
    plan = build_plan(cfg, PI, RunDir("/shared/runs/x"), job_id=1)
    # The signal reaches the supervisor through the config; no role reads it from its environment.
    assert not any(k in p.env for p in plan.processes for k in ("SRL_PREEMPT_SIGNAL", "SRL_STOP_FILE"))
    assert cfg.slurm.signal == "USR1"  # what the supervisor handles (toolkit.launch.supervisor reads the config)


def test_b15_logs_append_absolute_under_run_logs() -> None:
    lines = sbatch_lines(rendered())
    assert "#SBATCH --output=/shared/runs/golden-t2i1/logs/%x-%j.out" in lines
    assert "#SBATCH --error=/shared/runs/golden-t2i1/logs/%x-%j.out" in lines


def test_b22_secret_values_never_rendered(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "dummy-secret-123")
    monkeypatch.setenv("HF_TOKEN", "dummy-hf-456")
    text = rendered({"slurm": {"secret_env_vars": ["HF_TOKEN", "WANDB_API_KEY"]}}, tmp=tmp_path)
    assert "--secret HF_TOKEN --secret WANDB_API_KEY" in text  # by name: the job warns when one is not set
    for f in (tmp_path / "golden-t2i1" / "launcher").iterdir():
        body = f.read_text()
        assert "dummy-secret-123" not in body and "dummy-hf-456" not in body, f
    with pytest.raises(ConfigError, match="looks like a secret"):
        make_cfg(site="prime-intellect", env_vars={"WANDB_API_KEY": "dummy-secret-123"})


def test_b28_pre_run_command_goes_to_a_file(tmp_path: Path) -> None:
    text = rendered({"slurm": {"pre_run_command": "pkill -9 -f vllm || true"}}, tmp=tmp_path)
    assert "pkill" not in text and "bash -c" not in text
    pre = tmp_path / "golden-t2i1" / "launcher" / "pre_run.sh"
    assert "pkill -9 -f vllm" in pre.read_text()
    assert "pkill" not in (Path(__file__).resolve().parents[2] / "toolkit" / "launch" / "supervisor.py").read_text()


def test_b28_pkill_in_pre_run_warns() -> None:
    from config_cases import validate
    from golden.layouts import BASE

    loaded = validate(merge(BASE, {"site": "prime-intellect", "slurm": {"pre_run_command": "pkill -f vllm"}}))
    assert any("pkill" in w.message for w in loaded.warnings)


def test_sbatch_values_are_validated() -> None:
    assert sbatch_value("gpu-a100") == "gpu-a100"
    for bad in ("gpu a100", "x'y", 'x"y', "a\nb", ""):
        with pytest.raises(RenderError):
            sbatch_value(bad)
    # validation refuses it first, naming the field (tests/unit/test_hostile_config.py); the renderer still would
    with pytest.raises((RenderError, ConfigError), match="slurm.partition"):
        rendered({"slurm": {"partition": "gpu --wrap=id"}})


def test_accounting_sites_get_account_others_never() -> None:
    assert "--account" not in rendered()
    hpc = load_site("generic-hpc")
    text = rendered(
        {"deployment": {"gpus_per_node": 4}, "inference": {"vllm": {"tensor_parallel_size": 4}}},
        site=hpc,
        slurm={"account": "proj123"},
    )
    assert "#SBATCH --account=proj123" in text and "module load cuda/12.4" in text
    from toolkit.placement.environment import container_prefix

    assert container_prefix(hpc, "/shared/runs/x")[:3] == ["apptainer", "exec", "--nv"]


def test_user_template_gets_the_same_variables(tmp_path: Path) -> None:
    tpl = tmp_path / "mine.j2"
    tpl.write_text('{% include "_header.sbatch.j2" %}\necho {{ plan.processes|length }} {{ ctx.run_root|q }}\n')
    text = rendered({"slurm": {"template_path": str(tpl)}}, tmp=tmp_path)
    assert text.startswith("#!/bin/bash") and "#SBATCH --nodes=3" in text
    assert text.rstrip().endswith(f"echo 3 {tmp_path}/golden-t2i1")


def test_placement_json_lists_every_process(tmp_path: Path) -> None:
    rendered(tmp=tmp_path)
    data = json.loads((tmp_path / "golden-t2i1" / "launcher" / "placement.json").read_text())
    assert [p["name"] for p in data["processes"]] == ["inference-0-0", "trainer", "orchestrator"]
    assert {"role", "node_index", "gpus", "ports", "command", "env"} <= set(data["processes"][0])


def test_shipped_sites_never_pin_another_checkouts_interpreter() -> None:
    """A site's python is a command name (resolved to the submitting interpreter) or a site-wide install, never a
    path inside some user's checkout: jobs submitted from a second clone must run that clone's code."""
    import sys

    from toolkit.config.site import job_python

    for path in sorted((Path(__file__).resolve().parents[2] / "site-configs").glob("*.toml")):
        site = load_site(path.stem)
        assert "/work/" not in site.environment.python and ".venv" not in site.environment.python, path.name
    assert job_python(load_site("local-slurm")) == sys.executable


def test_site_cpu_request_per_group_and_the_users_own_wins() -> None:
    """``[cpus]`` of a site: cores per GPU for GPU groups, a count for groups without GPUs, one task per node; none
    when unset (the cluster's default); a CPU option among slurm.extra_directives replaces the first group's."""
    assert not any("cpus" in ln for ln in sbatch_lines(rendered()))  # unset: no request
    site = PI.model_copy(update={"cpus": CpusSection(per_gpu=12, without_gpus=6)})
    # train2-infer1 on 8-GPU nodes: one group of 3 nodes with 8 GPUs each.
    assert [ln for ln in sbatch_lines(rendered(site=site)) if "cpus" in ln] == ["#SBATCH --cpus-per-task=96"]
    for own in ("--cpus-per-task=32", "--exclusive", "--cpus-per-gpu=4", "--mincpus=16", "--tres-per-task=cpu:8"):
        lines = sbatch_lines(rendered({"slurm": {"extra_directives": [own]}}, site=site))
        assert [ln for ln in lines if "cpu" in ln or "exclusive" in ln] == [f"#SBATCH {own}"], own
    # Options that only look like one are no CPU request: --exclusive=user takes no whole node.
    for other in ("--comment=cpus", "--exclusive=user"):
        lines = sbatch_lines(rendered({"slurm": {"extra_directives": [other]}}, site=site))
        assert "#SBATCH --cpus-per-task=96" in lines, other
    assert CpusSection(per_gpu=12).per_node(0) is None and CpusSection(without_gpus=6).per_node(4) is None
    with pytest.raises(ValueError):
        CpusSection(per_gpu=0)


def test_a_group_without_gpus_gets_the_sites_cpu_count() -> None:
    """A node group without GPUs (here a model-free gate job's) asks ``without_gpus`` cores."""
    site = PI.model_copy(update={"cpus": CpusSection(per_gpu=12, without_gpus=6)})
    cfg = make_cfg(LAYOUTS["train2-infer1"], site=site.name)
    run = RunDir(Path(cfg.output_dir) / cfg.run.name)
    plan = build_plan(cfg, site, run, job_id="pending", roles=("gate",))
    ctx = build_context(cfg, site, run, plan, attempt=1, kind="eval")
    assert "--cpus-per-task=6" in ctx.directives[0] and not any("gpu" in d for d in ctx.directives[0])


def test_job_steps_name_the_cores_their_job_holds(monkeypatch) -> None:
    """A step asks the cores per task sbatch granted its node group (srun of Slurm 22.05-23.02 does not take the
    job's --cpus-per-task); nothing when the job asked none, so the step may use all its job holds."""
    from toolkit.launch.supervisor import step_argv, step_cpus

    assert step_cpus(0, False, {"SLURM_CPUS_PER_TASK": "96"}) == "96"
    assert step_cpus(1, True, {"SLURM_CPUS_PER_TASK_HET_GROUP_1": "6", "SLURM_CPUS_PER_TASK": "96"}) == "6"
    assert step_cpus(0, False, {}) is None and step_cpus(0, False, {"SLURM_CPUS_PER_TASK": "x"}) is None
    cfg = make_cfg(LAYOUTS["train2-infer1"], site=PI.name)
    run = RunDir(Path(cfg.output_dir) / cfg.run.name)
    plan = build_plan(cfg, PI, run, job_id="pending")
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    step = step_argv(plan, plan.process("trainer"), run, Path("/l/t.log"), python="py", container=[])
    assert not any(a.startswith("--cpus-per-task") for a in step)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "96")
    assert "--cpus-per-task=96" in step_argv(
        plan, plan.process("trainer"), run, Path("/l/t.log"), python="py", container=[]
    )
