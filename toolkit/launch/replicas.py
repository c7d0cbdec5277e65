"""Elastic inference replicas on Slurm: ``srl inference join RUN`` submits them, the run's end cancels them.

A replica is one inference island of the run (the engines ``[inference.deployment]`` places on one node or
island), submitted as an ``srl inference`` deployment of the run's model into ``<run>/replicas/replica-<n>/``
through the one launch pipeline: preflight, its own run directory (lease, admin token, readiness file), its own
batch job on ``[deployment.elastic]``'s partition, time limit and QOS (a job that Slurm requeues comes back as
the same replica). The run's orchestrator joins it once it answers (``toolkit.orchestrator.replicas``).

With ``deployment.elastic.replicas`` = K, ``srl rl`` submits K replica jobs right after the run's job, each
waiting for the run's job to start (``--dependency=after:<job>``).

The run owns its replicas: when the run's batch job ends for good (finished, failed, cancelled; not a requeue)
its supervisor cancels the replica jobs still queued or running (:func:`cancel_replicas`).
"""

from __future__ import annotations

import sys

from ..config import ConfigError, LoadedConfig, RLConfig, load_resolved
from ..config.model import MultiNodeDeployment, infer_replica_fields
from ..run.layout import RunDir
from . import slurm
from .submit import read_job_ids


def _elastic_run(run: RunDir) -> RLConfig:
    """The run's config, refused (ConfigError naming the field) unless replicas can join it."""
    path = run.resolved("rl")
    if not path.is_file():
        raise ConfigError(f"{run.root} is not an srl rl run directory ({path} is missing)")
    cfg = load_resolved(path)
    dep = cfg.deployment
    if not isinstance(dep, MultiNodeDeployment) or dep.elastic is None:
        raise ConfigError(
            f"deployment.elastic: {run.root} was not started with [deployment.elastic] (a multi_node deployment "
            "with it has a router that replicas join); add it and resume the run (srl rl ... --resume)"
        )
    if cfg.inference.external:
        raise ConfigError(f"inference.external: {run.root} samples from another deployment; grow that one instead")
    if cfg.inference.deployment.type == "disaggregated":
        raise ConfigError("inference.deployment: replicas of a prefill/decode deployment cannot join yet")
    return cfg


def live_replica_jobs(run: RunDir) -> list[str]:
    """Job ids of the run's replica jobs that Slurm still holds (queued, running, requeued)."""
    ids = [job for replica in run.replica_runs() for job, _, _ in read_job_ids(replica)]
    return slurm.live_jobs(ids) if ids else []


def replica_config(
    cfg: RLConfig, run: RunDir, n: int, *, partition: str | None = None, time: str | None = None
) -> LoadedConfig:
    """The ``srl inference`` config of replica ``n`` of ``run``: the run's model, engines and site, one inference
    island, on ``[deployment.elastic]``'s partition/time/QOS (``partition``/``time`` override them)."""
    dep = cfg.deployment
    assert isinstance(dep, MultiNodeDeployment) and dep.elastic is not None
    el = dep.elastic
    data = cfg.model_dump(mode="json")
    data["output_dir"] = str(run.replicas)
    data["run"] = {**data["run"], "name": run.replica_run(n).root.name}
    data["deployment"].update(infer_replica_fields(cfg, 1), elastic=None, orchestrator_partition=None)
    s = data["slurm"]
    s["partition"] = partition or el.partition or s.get("partition")
    s["time"] = time or el.time
    s["qos"] = el.qos or s.get("qos")
    s["job_name"] = f"{cfg.slurm.job_name or run.root.name}-replica-{n}"
    data["resume"] = {}
    try:
        replica = RLConfig.model_validate(data)
    except ValueError as e:
        raise ConfigError(f"deployment.elastic: the replica job's config is invalid: {e}") from None
    return LoadedConfig(replica, purpose="serve")


def join(
    run: RunDir,
    *,
    count: int,
    partition: str | None,
    time: str | None,
    argv: list[str],
    dependency: str | None = None,
) -> list[str]:
    """Submit ``count`` replica jobs for ``run`` (module doc); returns their job ids. ``dependency``: a Slurm
    dependency of each (``after:<run's job>``: start once the run's job has started). Raises ConfigError (nothing
    submitted) when the run cannot take replicas, the site has no Slurm, or ``count`` would exceed
    ``deployment.elastic.max_replicas`` with the replicas Slurm still holds."""
    from ..preflight.site import load_site
    from .pipeline import Launch, start

    cfg = _elastic_run(run)
    if not load_site(cfg.site).is_slurm:
        raise ConfigError(f"site: replicas join as Slurm jobs; site '{cfg.site}' has no Slurm")
    if count < 1:
        raise ConfigError(f"--count: at least 1 (got {count})")
    if time is not None:
        from ..config.slurm_time import parse_slurm_time

        try:
            parse_slurm_time(time)
        except ValueError as e:
            raise ConfigError(f"--time: {e}") from None
    el = cfg.deployment.elastic  # type: ignore[union-attr]
    live = live_replica_jobs(run)
    if len(live) + count > el.max_replicas:
        raise ConfigError(
            f"--count {count}: the run has {len(live)} replica job(s) in Slurm ({', '.join(live) or 'none'}) and "
            f"deployment.elastic.max_replicas is {el.max_replicas}"
        )
    first = max(run.replica_numbers(), default=0) + 1
    jobs = []
    for n in range(first, first + count):
        loaded = replica_config(cfg, run, n, partition=partition, time=time)
        req = Launch(loaded, run.replica_run(n), argv=argv, kind="inference", dependency=dependency)
        started = start(req)
        if started.job_id:
            jobs.append(started.job_id)
    return jobs


def cancel_replicas(run: RunDir, *, say=None) -> list[str]:
    """Cancel the run's replica jobs that Slurm still holds (the run ended); returns their ids. Never raises: a
    replica job that cannot be cancelled is reported through ``say`` and ends at its own time limit."""
    out = say or (lambda msg: print(msg, file=sys.stderr))
    try:
        live = live_replica_jobs(run)
    except slurm.SlurmCommandError as e:
        out(f"could not list the run's replica jobs: {e}")
        return []
    for job in live:
        try:
            slurm.cancel(job)
        except slurm.SlurmCommandError as e:
            out(f"could not cancel replica job {job}: {e}")
    if live:
        out(f"cancelled replica job(s) {', '.join(live)}: the run ended")
    return live
