"""The first-run gate as a Slurm job (submitit), so it can run next to the data and gate a training job.

``submit_gate`` pickles ``job_main(argv)`` into a ``submitit.SlurmExecutor`` job with the site's partition,
account (only where the site has accounting), modules and setup lines, the run config's ``[slurm]`` qos,
constraint, node list/exclude and extra directives, and a GPU for ``srl eval run`` on GPU sites. Logs go under
``<run>/logs/eval/submitit/<job id>/``. The job runs the same ``srl eval`` command with ``--in-job`` (no second
submission) and exits non-zero when the gate fails, so ``sbatch --dependency=afterok:<id>`` starts training only
after a passed gate.

Job state comes from ``toolkit.launch.slurm.job_state`` (``scontrol``/``squeue``), never from ``sacct``: many
clusters, the local test cluster included, have no accounting. The verdict is read back from the run's
``reports/`` (written by the job) and the job's result pickle.

Light at import: submitit is imported when submitting.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from toolkit.run.layout import RunDir
from toolkit.run.verdict import GATE_STEM, VALIDATE_STEM, Verdict, read_verdict

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig
    from toolkit.config.site import SiteConfig


class GateFailed(RuntimeError):
    """Raised inside the Slurm job when the gate fails, so the job ends FAILED (non-zero exit) and ``afterok``
    dependents never start."""

    def __init__(self, exit_code: int, summary: str) -> None:
        super().__init__(f"first-run gate failed (exit code {exit_code}): {summary}")


def job_main(argv: list[str]) -> dict[str, Any]:
    """Entry point of the Slurm job: ``srl eval <argv> --in-job``. Returns ``{"exit_code": 0, "verdict": {...}}``
    when the gate passes; raises GateFailed (the job then fails) otherwise."""
    from toolkit.evalgate import main

    rc = main([*argv, "--in-job", "--no-rich"])
    verdict = _latest_verdict(argv)
    if rc != 0:
        failed = ", ".join(f"{i.env}/{i.key}" for i in verdict.failed()) if verdict else "no verdict written"
        raise GateFailed(rc, failed)
    return {"exit_code": rc, "verdict": verdict.to_dict() if verdict else None}


def _latest_verdict(argv: list[str]) -> Verdict | None:
    if "--run-dir" not in argv:
        return None
    stem = VALIDATE_STEM if argv[0] == "validate" else GATE_STEM
    return read_verdict(RunDir(argv[argv.index("--run-dir") + 1]), stem)


def executor_parameters(cfg: RLConfig, site: SiteConfig, *, command: str, job_name: str) -> dict[str, Any]:
    """submitit ``SlurmExecutor.update_parameters`` keywords for the gate job on ``site``.

    ``time`` is in minutes (from ``cfg.slurm.time``, rounded up; unlimited -> 0 = the partition's limit).
    """
    from toolkit.config.slurm_time import parse_slurm_time

    s = cfg.slurm
    secs = parse_slurm_time(s.time)
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": 0 if secs is None else max(1, -(-secs // 60)),
        "cpus_per_task": 2,
        "ntasks_per_node": 1,
        "nodes": 1,
        "wckey": "",  # submitit's default wckey needs accounting with TrackWCKey
    }
    partition = s.partition or site.partitions.cpu or site.partitions.default
    if command == "run" and site.gpu.gpus_per_node > 0:
        partition = s.partition or site.partitions.default
        if site.gpu.request_style == "gres":
            params["gres"] = f"gpu:{site.gpu.gres_type}:1" if site.gpu.gres_type else "gpu:1"
        else:
            params["gpus_per_node"] = 1
    if partition:
        params["partition"] = partition
    if site.accounting.enabled:
        account = s.account or site.accounting.default_account
        if account:
            params["account"] = account
    for key in ("qos", "constraint", "exclude", "nodelist"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    extra: dict[str, Any] = {}
    for d in s.extra_directives:
        k, _, v = d.removeprefix("--").partition("=")
        extra[k] = v if v else True
    if extra:
        params["additional_parameters"] = extra
    setup = [f"module load {m}" for m in site.environment.modules] + list(site.environment.setup)
    if setup:
        params["setup"] = setup
    return params


def submit_gate(cfg: RLConfig, site: SiteConfig, run: RunDir, argv: list[str], *, command: str) -> Any:
    """Submit ``srl eval <command> <argv>`` as a submitit Slurm job; returns the submitit Job (``job_id``).

    ``argv`` must name config files by absolute path and include ``--run-dir`` (the node may start elsewhere).
    Raises submitit's FailedSubmissionError (sbatch's message) when Slurm refuses the job.
    """
    import submitit

    from toolkit.config.site import job_python

    folder = run.logs / "eval" / "submitit" / "%j"
    executor = submitit.SlurmExecutor(folder=folder, python=job_python(site))
    name = f"{cfg.slurm.job_name or run.root.name}-eval-{command}"[:120]
    executor.update_parameters(**executor_parameters(cfg, site, command=command, job_name=name))
    return executor.submit(job_main, [command, *argv])


def wait_gate(
    job: Any, run: RunDir, *, command: str, submitted_at: float, timeout_s: float, poll_s: float = 1.0
) -> tuple[int, Verdict | None, str]:
    """Wait for the gate job to end (state from scontrol/squeue); returns (exit code, verdict, Slurm state).

    The exit code is 0 for a passed gate, 1 for a failed one, 3 when the job ended without a verdict (killed,
    timed out, crashed; see its logs). Raises TimeoutError after ``timeout_s`` seconds.
    """
    from toolkit.launch import slurm

    state = slurm.wait(str(job.job_id), timeout_s=timeout_s, poll_s=poll_s)
    stem = VALIDATE_STEM if command == "validate" else GATE_STEM
    verdict = None
    deadline = time.monotonic() + 15.0  # the shared filesystem may show the report a moment after the job ends
    while verdict is None and time.monotonic() < deadline:
        verdict = read_verdict(run, stem, newer_than=submitted_at)
        if verdict is None:
            time.sleep(0.5)
    if verdict is None:
        return 3, None, state.state
    if state.state == "COMPLETED" and verdict.passed:
        return 0, verdict, state.state
    return 1, verdict, state.state
