"""The orchestrator role: ``srl orchestrator --run-dir RUN`` (started by the launchers, one per run).

Reads ``<run>/configs/latest/resolved/rl.json``, waits for the inference readiness file, starts the train and eval
envs, then for each trainer step n = start+1 .. max_steps:

1. waits until the served policy is recent enough for step n (``time/wait_for_policy``; see ``policy.py``);
2. runs the periodic eval when n is an eval step (step 0 = the baseline, before any training);
3. collects finished groups into the batch (``buffer.py``) while the producer keeps up to ``max_concurrent``
   rollouts in flight, so generation of the next batch overlaps the trainer's work on the previous one;
4. appends every rollout to the store, writes ``rollouts/step_<n>/`` for the trainer, writes the metrics line;
5. saves its checkpoint part at the trainer's checkpoint steps; checks the stop request and stop criteria.

Resume: from the newest complete checkpoint (or ``resume.step``). Batches already written after it by the earlier
attempt are kept (they satisfy their policy bound, and the trainer may be reading them) and generation continues
after the last of them, with the sampler state saved in that batch's metadata. Metrics lines are never written
twice for a step. A stop request (``control/STOP``) makes it save its state and exit 0.

Launch: ``srl orchestrator --run-dir outputs/my-run`` (the local and Slurm launchers do this).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit import batches, checkpoints, fsutil, lease
from toolkit.lease import exit_when_lease_gone
from toolkit.orchestrator.buffer import BufferSettings, StepBatch
from toolkit.orchestrator.engines import EngineWatch, provider_retry_budget_s
from toolkit.orchestrator.evaluation import EvalEnv, run_eval
from toolkit.orchestrator.policy import (
    PolicyTracker,
    may_launch_ahead,
    min_policy_version,
    rollout_age,
    run_identity,
)
from toolkit.orchestrator.producer import GroupProducer, TrainEnv, env_list, env_sampling
from toolkit.orchestrator.records import MetricsLog, step_metrics
from toolkit.orchestrator.replicas import ReplicaPool
from toolkit.orchestrator.sampler import EnvSampler
from toolkit.orchestrator.state import is_checkpoint_step, load_state, save_state
from toolkit.orchestrator.stop import StopChecks
from toolkit.orchestrator.teacher import SelfDistillation, TeacherError, TeacherScorer
from toolkit.orchestrator.writer import RecordWriter
from toolkit.run.control import request_stop
from toolkit.run.heartbeat import FINISHED, LONG, STARTUP, WEIGHTS, Heartbeat, enable_stack_dumps
from toolkit.run.layout import RunDir
from toolkit.run.metrics import EVAL_POLICY_VERSION
from toolkit.run.types import SamplingParams

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig


log = logging.getLogger("srl.orchestrator")
QUEUE_POLL_S = 0.2
EVAL_STOP_POLL_S = 1.0  # how often a running eval checks for a stop request, seconds


def sampling_record(train_envs: dict[str, TrainEnv], envs: list[str]) -> dict[str, Any]:
    """The batch's ``meta["sampling"]`` (``batches.sampling_meta``): the distribution its samples were drawn from,
    which the trainer applies to its own logits. ``envs`` names each sample's train env (an empty batch records the
    first env's). Raises ValueError when the samples' envs sampled differently (config validation refuses such
    per-env overrides: the trainer scores one batch under one distribution)."""
    names = sorted(n for n in set(envs) if n in train_envs) or list(train_envs)[:1]
    records = {n: batches.sampling_meta(train_envs[n].sampling) for n in names}
    if len({json.dumps(r, sort_keys=True) for r in records.values()}) > 1:
        raise ValueError(f"one batch holds samples drawn with different temperature/top_p/top_k: {records}")
    return next(iter(records.values()), batches.sampling_meta(SamplingParams()))


class StopBeforeStart(Exception):
    """A stop request arrived before inference was ready: nothing was generated, nothing needs saving."""


class Orchestrator:
    """One run's orchestrator. ``cfg`` is the resolved ``RLConfig``; ``client`` and ``updater`` may be given (tests,
    benchmarks); otherwise they are built from the inference readiness file."""

    def __init__(self, cfg: RLConfig, run: RunDir, *, client: Any = None, updater: Any = None) -> None:
        self.cfg = cfg
        self.run = run
        self.ocfg = cfg.orchestrator
        self.client = client
        self.updater = updater
        self.train_envs: dict[str, TrainEnv] = {}
        self.eval_envs: list[EvalEnv] = []
        self.runtimes: list[Any] = []
        self.metrics = MetricsLog(run, enabled=cfg.monitors.file)
        self.writer = RecordWriter(run.root)  # store rows and batches, written by a child process
        self.stop_criteria = StopChecks(cfg.monitors.stop, run.metrics)
        # Read by the supervisor's watchdog: phase changes here, beats from _beat while the event loop runs.
        self.progress = Heartbeat(run, "orchestrator")
        self.snapshots: dict[int, dict[str, Any]] = {}  # step -> state after its batch, not yet saved
        self.saved_steps: set[int] = set()
        self.engine_urls: list[str] = []
        # Versions this run loads are "<run id>:<step>"; completions an engine reports with another run's versions
        # are dropped (toolkit.inference.versions).
        self.run_id = run_identity(run)
        self._admin_token: str | None = None  # set from the readiness of inference (_connect_inference)
        self._router_url: str | None = None  # the run's router, where elastic replicas join (_connect_inference)
        self.replica_pool: ReplicaPool | None = None  # elastic replicas ([deployment.elastic]; _start_tracker)
        self._retries_seen = 0  # the client's retry count at the last step's metrics
        self._served_model = cfg.model.name  # the policy's served model name (the readiness file's)
        self._sigterm = False

    # -- setup ------------------------------------------------------------------------------------------------
    async def _connect_inference(self) -> int:
        """Build the client and weight updater from the readiness file; returns the served policy version."""
        from toolkit.engines.health import read_ready
        from toolkit.inference.client import PolicyClient
        from toolkit.inference.weights import WeightUpdater

        ready_run = RunDir(self.cfg.inference.external) if self.cfg.inference.external else self.run
        wait_s = self.cfg.inference.startup_timeout_s + 60.0
        ready = await asyncio.to_thread(read_ready, ready_run, wait_s, should_stop=self._should_stop)
        if ready is None:
            raise StopBeforeStart("stop requested while waiting for inference")
        base_url = ready.get("router_url") or ready.get("base_url") or ready["engine_urls"][0]
        if self.client is None:
            self.client = PolicyClient(
                base_url,
                ready["model"],
                timeout_s=self.cfg.inference.router.request_timeout_s,
                max_connections=max(16, self.ocfg.max_concurrent),
                retry_budget_s=provider_retry_budget_s(
                    self.cfg.inference.startup_timeout_s, self.cfg.inference.max_restarts
                ),
                run_id=self.run_id,
                lora=self.cfg.trainer.model.lora is not None,
            )
        # Admin token for the engines' admin routes (weight updates, the engine watch): own engines take the
        # launcher's SRL_ADMIN_TOKEN, an external deployment its token file.
        from toolkit.engines.admin_token import admin_token_from_env, read_token_file

        if self.cfg.inference.external:
            self._admin_token = read_token_file(ready_run.admin_token_file)
            if self._admin_token is None:
                log.warning(
                    "%s is missing: the external deployment will refuse weight updates", ready_run.admin_token_file
                )
        else:
            self._admin_token = admin_token_from_env()
        if self.updater is None and self.ocfg.update_weights:
            self.updater = WeightUpdater(
                ready["engine_urls"],
                admin_token=self._admin_token,
                run_id=self.run_id,
                s_per_gib=self.cfg.monitors.stall_s_per_gib,
            )
            # Look up the engines' KV file stores now (vLLM's first /server_info takes seconds), while the env
            # workers start, rather than on the first update's STABLE-to-serving path.
            try:
                await self.updater.prepare()
            except Exception as exc:  # noqa: BLE001 - the first update looks them up again and fails loudly there
                log.warning("could not look up the engines' KV stores yet: %s", exc)
            if self.cfg.inference.external:
                await self._claim_base_weights()
        self.engine_urls = list(ready["engine_urls"])  # watched for restarts (engines.EngineWatch)
        self._router_url = ready.get("router_url")
        self._served_model = ready["model"]
        log.info("inference ready: %s (model %s, engines %s)", base_url, ready["model"], ready["engine_urls"])
        return int(ready.get("policy_version") or 0)

    async def _connect_teachers(self) -> None:
        """Give each distilling env its teacher scorer, before any rollout is sampled: for ``opsd`` the policy's own
        engines (:class:`SelfDistillation`); for ``opd`` its teacher (:meth:`_teacher_address`). Refuses an ``opd``
        teacher whose tokenizer is not the policy's (``TeacherError`` names both); that check needs an engine of the
        policy to compare with (none with an injected client: then only a warning)."""
        for _field, env_cfg, algo in self.ocfg.distilling_envs():
            env, label = self.train_envs[env_cfg.env_name], f"env {env_cfg.env_name}"
            t = algo.teacher
            if t is None:  # opsd
                env.teacher = SelfDistillation(
                    algo,
                    client=self.client,
                    runtime=env.runtime,
                    max_concurrent=self.ocfg.max_concurrent,
                    timeout_s=self.cfg.inference.router.request_timeout_s,
                    label=label,
                )
                continue
            name, base_url = await self._teacher_address(t)
            scorer = TeacherScorer(
                name,
                base_url,
                max_concurrent=t.max_concurrent,
                timeout_s=t.timeout_s,
                api_key_var=t.api_key_var,
                label=label,
                top_k=algo.top_k,
            )
            if self.engine_urls:
                await scorer.check_tokenizer(self.engine_urls[0], self._served_model)
                log.info("%s shares the policy's tokenizer", scorer.label)
            else:
                log.warning("no policy engine URL known: the tokenizer of %s is not checked", scorer.label)
            env.teacher = scorer

    async def _teacher_address(self, cfg: Any) -> tuple[str, str]:
        """``(model name, base URL .../v1)`` of an ``opd`` teacher (a ``TeacherConfig``): the endpoint as configured,
        the run's own teacher engine (``serve``: its URL from the plan, ``SRL_TEACHER_URL_<k>``), or an
        ``srl inference`` deployment's from its readiness file, waited for like ``inference.external``.
        Raises TeacherError while another run trains weights into that deployment, StopBeforeStart on a stop
        request while waiting."""
        if cfg.serve:  # an engine of this run's plan, healthy before inference was published ready
            k = self.cfg.orchestrator.served_teacher_index(cfg.name)
            url = os.environ.get(f"SRL_TEACHER_URL_{k}")
            if not url:
                raise TeacherError(f"teacher {cfg.name!r}: SRL_TEACHER_URL_{k} is not set (start the run with srl rl)")
            return cfg.name, url
        if cfg.deployment is None:
            return cfg.name, cfg.base_url
        dep = RunDir(Path(cfg.deployment).expanduser())
        self.progress.phase(f"waiting for the teacher deployment {dep.root}", kind=STARTUP)
        wait_s = self.cfg.inference.startup_timeout_s + 60.0
        from toolkit.engines.health import read_ready

        ready = await asyncio.to_thread(read_ready, dep, wait_s, should_stop=self._should_stop)
        if ready is None:
            raise StopBeforeStart("stop requested while waiting for the teacher deployment")
        why = lease.teacher_refusal(dep)
        if why is not None:
            raise TeacherError(f"the teacher deployment: {why}")
        base_url = ready.get("router_url") or ready.get("base_url") or ready["engine_urls"][0]
        return cfg.name or ready["model"], base_url + "/v1"

    async def _claim_base_weights(self) -> None:
        """On an external deployment that serves another run's weights (a run that used it before this one): load
        this run's base model first, so this run's first rollouts are sampled with its own policy version 0 (the
        engine then reports "base"), not with that run's weights (all of which would be dropped)."""
        from toolkit.models.resolve import resolve_model

        path = await asyncio.to_thread(resolve_model, self.cfg.model.name)
        seconds = await self.updater.reset_base(Path(path))
        if seconds is not None:
            log.warning(
                "the external deployment %s served weights of another run; loaded this run's base model "
                "%s into it (%.2f s)",
                self.cfg.inference.external,
                path,
                seconds,
            )

    async def _start_envs(self) -> None:
        from toolkit.envs.runtime import EnvRuntime
        from toolkit.models.resolve import resolve_model

        model_path = await asyncio.to_thread(resolve_model, self.cfg.model.name)
        o = self.ocfg
        specs = env_list(self.cfg)
        runtimes = [EnvRuntime(e, model_path=model_path, renderer_cfg=o.renderer, seed=self.cfg.seed) for e, _ in specs]
        self.runtimes.extend(runtimes)
        # worker start-up is slow (imports): overlap it
        await asyncio.gather(*(rt.start() for rt in runtimes))
        for (env_cfg, kind), rt in zip(specs, runtimes, strict=True):
            gs = env_cfg.group_size or o.group_size
            sp = env_sampling(self.cfg, env_cfg, kind)
            if kind == "eval":
                # One base seed per env for the whole run: every eval point samples the same draws.
                seed = o.eval.seed if o.eval.seed is not None else sp.seed
                self.eval_envs.append(EvalEnv(env_cfg.name, rt, env_cfg.num_examples, gs, sp, seed=seed))
            else:
                self.train_envs[env_cfg.name] = TrainEnv(env_cfg.name, rt, gs, sp)
            log.info("env %s started (%s, %d examples, group size %d)", env_cfg.name, kind, rt.num_examples, gs)
        if not self.train_envs and self.ocfg.training_mode == "rl":
            raise ValueError("orchestrator.train.env is empty: nothing to train on")

    # -- resume -----------------------------------------------------------------------------------------------
    def _resume(self, sampler: EnvSampler) -> tuple[int, dict[str, Any]]:
        """Returns (last step whose batch exists, state to continue from) and restores the sampler."""
        ckpt = checkpoints.resume_step(self.run, self.cfg.resume.step)
        state: dict[str, Any] = {}
        step = 0
        if ckpt is not None:
            state = load_state(self.run, ckpt) or {}
            step = ckpt
            log.info("resuming from checkpoint step %d", ckpt)
        if self.cfg.resume.step is None:  # an explicit older step starts a new timeline: regenerate after it
            while batches.is_ready(self.run.rollout_step(step + 1)):
                step += 1
                meta = json.loads((self.run.rollout_step(step) / batches.META_FILE).read_text()).get("meta", {})
                if not self.metrics.has(step) and "metrics" in meta:
                    self.metrics.write(step, {**meta["metrics"], "resumed_from_batch": 1.0})
                state = meta.get("orchestrator_state") or state
            if step != (ckpt or 0):
                log.info("batches up to step %d were written by an earlier attempt; continuing after them", step)
        if state.get("sampler"):
            sampler.load_state_dict(state["sampler"])
        return step, state

    # -- one step ---------------------------------------------------------------------------------------------
    def _mean_group_size(self) -> float:
        return sum(e.group_size for e in self.train_envs.values()) / len(self.train_envs)

    def _planned_groups(self) -> int:
        """Groups one step launches: ``batch_size * oversampling_factor / mean group size``, rounded up."""
        return max(
            1,
            math.ceil(self.ocfg.batch_size * self.ocfg.buffer.oversampling_factor / self._mean_group_size()),
        )

    def _prefetch(self, next_step: int, producer: GroupProducer, tracker: PolicyTracker) -> None:
        """Launch the groups of ``next_step`` now, while this step's batch is written, when the policy already
        served is recent enough for that step's off-policy bound (so the step will not wait for a newer one).

        Without this the engines idle during every write and every metrics line; with it, writes overlap
        generation. Nothing is launched past ``max_steps`` or when the bound would force a wait: those rollouts
        would only be dropped as too old.
        """
        if self._should_stop():
            return
        if may_launch_ahead(next_step, self.cfg.max_steps, tracker.served_version, self.ocfg.max_async_level):
            producer.want(self._planned_groups())

    def _should_stop(self) -> bool:
        return self._sigterm or self.run.stop_request.exists()

    async def _next_group(self, producer: GroupProducer) -> list | None:
        """The next finished group; None on a stop request. Raises the producer's fatal error (a failed teacher)."""
        while True:
            if producer.failure is not None:
                raise producer.failure
            try:
                return await asyncio.wait_for(producer.queue.get(), QUEUE_POLL_S)
            except TimeoutError:
                if self._should_stop():
                    return None

    async def _collect(self, step: int, producer: GroupProducer) -> tuple[StepBatch | None, str | None]:
        """Fill the batch of ``step``. Returns (batch, stop reason); batch None when stopped mid-way."""
        o = self.ocfg
        b = o.buffer
        settings = BufferSettings(
            batch_size=o.batch_size,
            algo=o.train.algo.type,
            length_penalty=o.train.algo.length_penalty,
            env_algos={e.env_name: (e.algo.type, e.algo.length_penalty) for e in o.train.env if e.algo is not None},
            filtering=b.online_difficulty_filtering,
            easy_threshold=b.easy_threshold,
            hard_threshold=b.hard_threshold,
            max_off_policy_steps=o.off_policy_bound(),
        )
        batch = StepBatch(step=step, settings=settings)
        self.progress.phase(f"collecting the groups of step {step}", step=step)
        planned = self._planned_groups()
        mean_gs = self._mean_group_size()
        w_offered = w_kept = w_signal = 0  # the batch's group counts when the current window of groups began
        if not o.constant_trainer_batch_size:
            producer.want(planned)
        while True:
            if o.constant_trainer_batch_size:
                if batch.full:
                    break
                producer.want(math.ceil(batch.remaining / mean_gs * o.buffer.oversampling_factor))
            elif batch.groups_offered >= planned:
                break
            group = await self._next_group(producer)
            if group is None:
                producer.pause()
                return None, None
            self.progress.advance()  # a group collected
            env = self.train_envs.get(group[0].env) if group else None
            dropped = batch.offer(group, max_completion_tokens=env.sampling.max_tokens if env else None)
            if dropped == "foreign_policy":
                log.warning(
                    "step %d: dropped a group of %d rollouts: the engine sampled them with weights of "
                    "another run (version %s; this run's versions are %s:<step>); they are never trained "
                    "on (off_policy/foreign_dropped)",
                    step,
                    len(group),
                    batch.foreign_versions[-1],
                    self.run_id,
                )
            offered = batch.groups_offered - w_offered
            if o.constant_trainer_batch_size and offered >= planned and not batch.full:
                if batch.signal_groups == w_signal:  # a whole step's worth of groups without signal: an empty step
                    reason = self.stop_criteria.guard.observe(
                        step,
                        groups_offered=offered,
                        groups_kept=batch.groups_kept - w_kept,
                        signal_groups=0,
                        dropped=dict(batch.dropped_groups),
                    )
                    if reason:
                        producer.pause()
                        return None, reason
                w_offered, w_kept, w_signal = batch.groups_offered, batch.groups_kept, batch.signal_groups
        producer.pause()
        return batch, None

    async def _write_step(
        self,
        step: int,
        batch: StepBatch,
        times: dict[str, float],
        extra: dict[str, float],
        sampler_state: dict[str, Any],
        tracker: PolicyTracker,
    ) -> dict[str, float]:
        """Store rows, the trainer's batch, then the metrics line (the order a resume relies on).

        ``sampler_state`` is the producer's position when the batch was complete (``sampler`` and
        ``next_group_id``), taken before the next step's groups were launched, so a resume redraws those.
        """
        metrics = {**step_metrics(batch), **times, **extra, "policy/served_version": float(tracker.served_version)}
        retries = getattr(self.client, "retries", 0)
        metrics["inference/retried_requests"] = float(retries - self._retries_seen)
        self._retries_seen = retries
        if self.replica_pool is not None:
            metrics["inference/replicas"] = float(self.replica_pool.count)
            metrics["inference/replica_joins"] = float(self.replica_pool.joins)
            metrics["inference/replica_leaves"] = float(self.replica_pool.leaves)
            metrics["inference/lost_requests"] = float(self.replica_pool.lost_requests)
        for name, env in self.train_envs.items():
            if env.teacher is not None:
                stats = env.teacher.drain_stats()
                metrics[f"teacher/{name}/latency_s"] = stats["latency_s"]
                metrics[f"teacher/{name}/requests"] = stats["requests"]
        state = {"step": step, **sampler_state, "served_version": tracker.served_version}
        training = batch.training_samples()
        meta = {
            "metrics": metrics,
            "orchestrator_state": state,
            "algo": self.ocfg.train.algo.type,
            "rollouts": len(batch.rollouts),
            batches.SAMPLING_KEY: sampling_record(self.train_envs, training[3]),
        }
        # Written by the record writer's process, so the rollouts in flight keep being served meanwhile.
        ages = [rollout_age(step, r) for r in batch.recorded]
        self.progress.phase(f"writing batch {step}", step=step)
        await self.writer.persist_step(step, batch.recorded, ages, training, meta)
        self.metrics.write(step, metrics)
        self.snapshots[step] = state
        for old in [s for s in self.snapshots if s < step - self.ocfg.max_async_level - 2]:
            del self.snapshots[old]
        return metrics

    def _save(self, step: int) -> None:
        if step in self.saved_steps or step not in self.snapshots:
            return
        self.progress.phase(f"saving its checkpoint part of step {step}", step=step, kind=WEIGHTS)
        save_state(self.run, step, self.snapshots[step])
        self.saved_steps.add(step)

    def _save_recent(self) -> None:
        """On a stop: save the state of every recent step (the trainer checkpoints whichever it is at)."""
        for step in sorted(self.snapshots):
            self._save(step)

    async def _eval(self, step: int, tracker: PolicyTracker) -> dict[str, float] | None:
        """The eval metrics of the served policy, recorded at ``step`` (its rollouts go to the store); {} without
        eval envs; None when a stop came first: an eval waits on engines that may be held (restarting) for
        minutes, and a stop must not wait for it (nothing of a cancelled eval is recorded)."""
        if not self.eval_envs:
            return {}
        self.progress.phase(f"eval at step {step}", step=step, kind=LONG)
        t0 = time.monotonic()
        job = asyncio.ensure_future(
            run_eval(
                self.eval_envs, self.client, max_concurrent=self.ocfg.max_concurrent, on_group=self.progress.advance
            )
        )
        while not job.done():
            await asyncio.wait({job}, timeout=EVAL_STOP_POLL_S)
            if not job.done() and self._should_stop():
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)
                log.info("eval at step %d cancelled: stop requested", step)
                return None
        metrics, rollouts = job.result()
        version = tracker.served_version
        ages = [max(0, step - version)] * len(rollouts)
        await self.writer.append_store(rollouts, step=step, kind="eval", ages=ages)
        metrics[EVAL_POLICY_VERSION] = float(version)
        metrics["time/eval"] = time.monotonic() - t0
        log.info(
            "eval at step %d (policy %d): %s", step, version, {k: round(v, 4) for k, v in metrics.items() if "@" in k}
        )
        return metrics

    async def _final_eval(self, tracker: PolicyTracker) -> None:
        """Evaluate the policy the run ends with (version ``max_steps``, trained on the last batch) once the trainer
        has broadcast it, recorded as its own line at step ``max_steps``. The periodic evals run before a step's
        batch, so without this the last one measures a policy up to ``eval.interval`` steps old. Skipped without
        eval envs, when an earlier attempt recorded it, or when a stop comes while waiting. Each finished eval group
        is progress: the supervisor leaves a final eval that progresses running after the trainer's exit
        (``slurm.checkpoint_grace_s`` from the last progress), and its watchdog does not take it for a stall."""
        last = self.cfg.max_steps
        if not self.eval_envs or self.metrics.has_eval(last):
            return
        self.progress.phase(f"waiting for the trainer's final policy {last}", step=last, waiting_for="trainer")
        await tracker.load_first_at_least(last, self._should_stop)
        if self._should_stop() or tracker.served_version < last:
            return
        if (metrics := await self._eval(last, tracker)) is not None:
            self.metrics.write_eval(last, metrics)

    # -- main loop --------------------------------------------------------------------------------------------
    async def run_until_done(self) -> int:
        """Run to ``max_steps`` or a stop; returns the exit status (0 on completion or a stop request)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        except (NotImplementedError, RuntimeError):
            pass
        fsutil.remove_stale_temps(self.run.rollouts)
        self.progress.phase("connecting to inference, starting env workers", kind=STARTUP)
        beat = asyncio.create_task(self._beat())
        try:
            # Env workers take tens of seconds to import; start them while the engines come up instead of after.
            # return_exceptions so that one failing start still lets the other finish before the cleanup below.
            served, envs = await asyncio.gather(self._connect_inference(), self._start_envs(), return_exceptions=True)
            for outcome in (served, envs):
                if isinstance(outcome, StopBeforeStart):
                    log.info("%s: stopping before the first step", outcome)
                    return 0
                if isinstance(outcome, BaseException):
                    raise outcome
            try:
                await self._connect_teachers()
            except StopBeforeStart as stop:
                log.info("%s: stopping before the first step", stop)
                return 0
            # Everything made so far (tokenizer, imported modules, env handles) lives for the whole run: move it out
            # of the collector's generations, so the frequent collections of a busy loop stop re-scanning it
            # (about 15% of the loop's CPU per rollout in tests/benchmarks/orchestrator_overhead.py).
            gc.collect()
            gc.freeze()
            if self.ocfg.training_mode == "sft":
                return await self._eval_loop(served)
            return await self._loop(served)
        finally:
            for rt in self.runtimes:
                try:
                    await rt.aclose()
                except Exception:
                    log.exception("closing env %s failed", getattr(rt, "name", "?"))
            beat.cancel()
            # Nothing more reaches metrics.jsonl from here: the trainer's W&B mirror waits for this phase.
            self.progress.phase(FINISHED)
            self.writer.close()
            teachers = [e.teacher for e in self.train_envs.values() if e.teacher is not None]
            for owner in (self.client, self.updater, *teachers):  # their kept-open HTTP connections
                aclose = getattr(owner, "aclose", None)
                if aclose is not None:
                    await aclose()

    async def _beat(self) -> None:
        """Say, every second, that the event loop still runs (a loop blocked in a call stops beating). While the
        policy client's serving gate is closed (an engine down or restarting) the record says the orchestrator
        waits for inference: the supervisor's engine watch bounds that wait, and the progress watchdog does not
        blame the orchestrator for it. The phase it was in comes back when the gate opens."""
        p, saved = self.progress, None
        while True:
            if getattr(self.client, "held", False):
                if p.waiting_for != "inference":  # the gate closed, or the main loop entered a new phase meanwhile
                    saved = (p.name, p.waiting_for, p.kind, p.size_bytes)
                    p.phase(
                        f"waiting for inference (an engine is down or restarting) during: {p.name}",
                        waiting_for="inference",
                    )
            elif saved is not None:
                if p.waiting_for == "inference":
                    name, waits, kind, size = saved
                    p.phase(name, waiting_for=waits, kind=kind, size_bytes=size)
                saved = None
            p.set_pids([pid for rt in self.runtimes for pid in rt.pids])  # a replaced worker has a new pid
            p.beat()
            await asyncio.sleep(1.0)

    def eval_points(self) -> list[int]:
        """Policy versions an SFT run evaluates: 0 (the base model), every ``eval.interval`` steps, the last step."""
        every = self.ocfg.eval.interval
        last = self.cfg.max_steps
        return sorted({0, last, *(range(every, last + 1, every) if every else ())})

    async def _eval_loop(self, served: int) -> int:
        """The orchestrator of an SFT run (``training_mode = "sft"``): no training rollouts; for each eval point,
        wait until the trainer's broadcast of that step is served, evaluate, and record the eval under the served
        policy version (a slow eval may let the trainer move on: the newest broadcast is what gets measured, and
        its version is the step it is recorded at). Points recorded by an earlier attempt are skipped."""
        tracker, stop_follow, bg = self._start_tracker(served)
        try:
            for point in self.eval_points():
                if self.metrics.has(point) or self._should_stop():
                    continue
                if point > 0:  # point 0: the engines still serve the base model, whatever was broadcast since
                    self.progress.phase(f"waiting for the trainer's step {point}", step=point, waiting_for="trainer")
                    await tracker.load_first_at_least(point, self._should_stop)
                if self._should_stop():
                    break
                version = tracker.served_version
                if not self.metrics.has(version) and (metrics := await self._eval(version, tracker)) is not None:
                    self.metrics.write(version, metrics)
            log.info("SFT evals done" if not self._should_stop() else "stopped on request")
            return 0
        finally:
            await _stop_background(stop_follow, bg)

    def _start_tracker(self, served: int) -> tuple[PolicyTracker, asyncio.Event, list[asyncio.Task]]:
        """The policy tracker, the event that ends the loop's background tasks, and those tasks: the engine watch,
        which holds generation while an engine restarts (none with an injected client without a serving gate, as
        in tests, or when no engine URLs are known)."""
        tracker = PolicyTracker(
            self.run, self.client, self.updater, update_weights=self.ocfg.update_weights, served_version=served
        )
        stop = asyncio.Event()
        if not self.engine_urls or not hasattr(self.client, "hold"):
            return tracker, stop, []
        from toolkit.engines.admin_token import admin_headers

        watch = EngineWatch(self.client, tracker, self.engine_urls, headers=admin_headers(self._admin_token))
        tasks = [asyncio.create_task(watch.run(stop))]
        if getattr(self.cfg.deployment, "elastic", None) is not None and self._router_url:
            self.replica_pool = ReplicaPool(self.run, tracker, self._router_url, run_id=self.run_id)
            tasks.append(asyncio.create_task(self.replica_pool.run_until(stop)))
        return tracker, stop, tasks

    def _on_sigterm(self) -> None:
        log.warning("SIGTERM: stopping after saving state")
        self._sigterm = True

    async def _loop(self, served: int) -> int:
        o = self.ocfg
        sampler = EnvSampler(
            {n: e.runtime.example_ids() for n, e in self.train_envs.items()},
            {e.env_name: e.ratio for e in o.train.env},
            seed=self.cfg.seed,
        )
        last, state = self._resume(sampler)
        tracker, stop_follow, bg = self._start_tracker(served)
        producer = GroupProducer(
            self.train_envs,
            sampler,
            self.client,
            max_concurrent=o.max_concurrent,
            next_group_id=int(state.get("next_group_id", 0)),
        )
        bg += [asyncio.create_task(producer.run()), asyncio.create_task(tracker.follow(stop_follow))]
        try:
            if last == 0 and self.eval_envs and not self.metrics.has(0):
                await tracker.refresh()
                if (metrics := await self._eval(0, tracker)) is not None:
                    self.metrics.write(0, metrics)
            for step in range(last + 1, self.cfg.max_steps + 1):
                if self._should_stop():
                    break
                t0 = time.monotonic()
                need = min_policy_version(step, o.max_async_level)
                self.progress.phase(
                    f"waiting for policy {need} to collect step {step}", step=step, waiting_for="trainer"
                )
                waited = await tracker.wait_for(need, self._should_stop)
                if self._should_stop():
                    break
                extra: dict[str, float] = {}
                # The last step's eval is the final one (_final_eval), of the policy trained on its batch.
                final = bool(self.eval_envs) and step == self.cfg.max_steps
                if o.eval.interval and step % o.eval.interval == 0 and not final:
                    extra.update(await self._eval(step, tracker) or {})
                batch, reason = await self._collect(step, producer)
                if reason:
                    request_stop(self.run, reason)
                if batch is None:
                    break
                sampler_state = {"sampler": producer.sampler.state_dict(), "next_group_id": producer.next_group_id}
                self._prefetch(step + 1, producer, tracker)
                times = {"time/step": time.monotonic() - t0, "time/wait_for_policy": waited}
                m = await self._write_step(step, batch, times, extra, sampler_state, tracker)
                log.info(
                    "step %d: reward %.4f, batch %d rollouts (%d groups offered, %d kept), errored %d, "
                    "off-policy max %d, waited %.2f s for policy %d, %.2f s",
                    step,
                    m.get("reward/all/mean", float("nan")),
                    len(batch.rollouts),
                    batch.groups_offered,
                    batch.groups_kept,
                    int(m["errored_rollouts"]),
                    int(m["off_policy/max"]),
                    waited,
                    need,
                    m["time/step"],
                )
                if is_checkpoint_step(step, self.cfg.max_steps, self.cfg.ckpt.interval):
                    self._save(step)
                reason = self.stop_criteria.check(step, m) or self.stop_criteria.guard.observe(
                    step,
                    groups_offered=batch.groups_offered,
                    groups_kept=batch.groups_kept,
                    signal_groups=batch.signal_groups,
                    dropped=dict(batch.dropped_groups),
                )
                if reason:
                    request_stop(self.run, reason)
            if self._should_stop():
                self._save_recent()
                log.info("stopped on request; state saved for steps %s", sorted(self.saved_steps) or "none")
            else:
                log.info("all %d steps written", self.cfg.max_steps)
                await self._final_eval(tracker)
            return 0
        finally:
            await _stop_background(stop_follow, bg)


async def _stop_background(stop: asyncio.Event, tasks: list[asyncio.Task]) -> None:
    """End the loop's background tasks (policy follower, engine watch, producer): signal, cancel, await all."""
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    """``srl orchestrator --run-dir RUN``. Exit 0 on completion or stop request, 1 on an unrecoverable error."""
    parser = argparse.ArgumentParser(prog="srl orchestrator", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="the run directory written by `srl rl`")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s orchestrator %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step lines
    from toolkit.config import load_resolved

    run = RunDir(args.run_dir)
    enable_stack_dumps()  # the supervisor's watchdog asks a stuck orchestrator for its stacks (into this log)
    # Started by a supervisor: never produce batches once it is gone or the run belongs to another attempt.
    exit_when_lease_gone(run, "orchestrator")
    cfg = load_resolved(run.resolved("rl"))
    try:
        owner = own_external_deployment(cfg, run)
    except lease.LeaseHeld as exc:
        log.error("%s", exc)
        return 2
    try:
        return asyncio.run(Orchestrator(cfg, run).run_until_done())
    except (checkpoints.CheckpointError, TeacherError) as exc:
        log.error("%s", exc)
        return 1
    except Exception:
        log.exception("orchestrator failed")
        return 1
    finally:
        if owner is not None:
            owner.release()


def own_external_deployment(cfg: RLConfig, run: RunDir) -> lease.Lease | None:
    """Become the one run whose weights the external inference deployment serves (``inference.external``), before
    loading any weights into it; None when this run starts its own engines or never loads weights. Should the
    ownership ever pass to another run, this process exits at once (status 3): a weight load from here would
    replace that run's policy. A LoRA run takes a LoRA-tenant lease instead: its adapter is served under a name of
    its own (``srl-lora-<run id>``), so LoRA runs may share a deployment, but not with a full-weight run. Raises
    ``lease.LeaseHeld`` naming the run that excludes this one."""
    if not cfg.inference.external or not cfg.orchestrator.update_weights:
        return None
    deployment = RunDir(cfg.inference.external)
    if cfg.trainer.model.lora is not None:
        owner = lease.acquire_lora_tenant(deployment, run, run_identity(run), command="srl orchestrator")
    else:
        owner = lease.acquire_policy_owner(deployment, run, command="srl orchestrator")

    def _lost(reason: str) -> None:
        log.error("the external deployment's policy ownership is gone (%s); stopping at once", reason)
        os._exit(3)

    owner.on_lost(_lost)
    log.info("policy owner of the external deployment %s (%s)", cfg.inference.external, owner.slot.path)
    return owner


if __name__ == "__main__":
    sys.exit(main())
