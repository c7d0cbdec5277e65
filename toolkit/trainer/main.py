"""``srl trainer --run-dir DIR``: the RL trainer process (one process on CPU, or one rank under torchrun).

Per trainer step n (1..max_steps): wait for ``rollouts/step_<n>/`` (READY), pack it into micro-batches, take one
optimizer step, write the policy as ``broadcasts/step_<n>/`` (STABLE last; policy version n; a LoRA run writes
only the adapter), prune old broadcasts,
checkpoint every ``ckpt.interval`` steps and at the end, and append one metrics line to ``metrics.jsonl``.

Stop: when ``control/STOP`` exists or SIGTERM/SIGUSR2 arrives (the batch script forwards the pre-timeout signal),
the trainer finishes the step it is in (or abandons the wait for a batch), checkpoints the last finished step
and exits 0. Resume: the newest COMPLETE checkpoint of the run directory is loaded automatically (a requeued job
continues), ``resume.step`` picks one, ``resume.dir`` forks from another run directory. Steps retrained after a
resume keep the metrics line of their first attempt (one line per step in ``metrics.jsonl``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit import checkpoints, fsutil
from toolkit.lease import exit_when_lease_gone
from toolkit.run.heartbeat import STARTUP, WEIGHTS, Heartbeat, enable_stack_dumps, wait_until_finished
from toolkit.run.layout import RunDir

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig
    from toolkit.config.sft import SFTConfig

log = logging.getLogger("srl.trainer")


@dataclass(frozen=True)
class TrainerSettings:
    """Everything the trainer loop needs, as plain values: a frozen view of the resolved config, built by
    :meth:`from_config` from an RL or SFT config. No field has a default of its own:
    each value comes from the config class that declares the knob's one default.

    Units: ``batch_timeout_s`` seconds; ``seq_len`` tokens per packed row; ``micro_batch_size`` rows.
    ``ckpt_interval`` None = checkpoint only at the end and on stop; ``keep_last`` None = keep all checkpoints.
    ``loss``, ``broadcast_keep`` and ``batch_timeout_s`` are the RL loop's (None in an SFT run, whose loop reads
    none of them). The sampling temperature and truncation are not settings: each batch records the distribution
    its tokens were drawn from (``Batch.sampling``), and the trainer scores it under that one.
    """

    model_name: str
    max_steps: int
    dtype: str
    seed: int
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    max_norm: float
    max_nonfinite_steps: int
    scheduler: str
    warmup_steps: int
    min_lr_ratio: float
    micro_batch_size: int
    seq_len: int
    ckpt_interval: int | None
    keep_last: int | None
    keep_interval: int | None
    resume_step: int | None
    resume_dir: Path | None
    lora: dict | None
    wandb: dict | None
    """``monitors.wandb`` as a dict (None: no W&B); the main rank mirrors ``metrics.jsonl`` into it."""
    loss: Any = None
    """The config's ``IPOLoss | IcePopLoss`` (the loss classes are the config's)."""
    broadcast_keep: int | None = None
    batch_timeout_s: float | None = None

    @classmethod
    def from_config(cls, cfg: RLConfig | SFTConfig) -> TrainerSettings:
        """Map a resolved ``RLConfig`` or ``SFTConfig`` onto settings (attribute names of ``toolkit/config/``). An
        SFT run packs rows of ``data.seq_len`` tokens and leaves the RL loop's fields None."""
        from toolkit.config.sft import SFTConfig
        from toolkit.trainer.broadcast import broadcast_keep

        t = cfg.trainer
        sched = t.scheduler
        shared = {
            "model_name": str(cfg.model.name),
            "dtype": cfg.model.dtype,
            "max_steps": cfg.max_steps,
            "seed": cfg.seed,
            "lr": t.optim.lr,
            "weight_decay": t.optim.weight_decay,
            "betas": tuple(t.optim.betas),
            "max_norm": t.optim.max_norm,
            "max_nonfinite_steps": t.optim.max_nonfinite_steps,
            "scheduler": sched.type,
            "warmup_steps": 0 if sched.type == "constant" else sched.warmup_steps,
            "min_lr_ratio": sched.min_lr_ratio if sched.type in ("linear", "cosine") else 0.0,
            "micro_batch_size": t.micro_batch_size,
            "ckpt_interval": cfg.ckpt.interval,
            "keep_last": cfg.ckpt.keep_last,
            "keep_interval": cfg.ckpt.keep_interval,
            "resume_step": cfg.resume.step,
            "resume_dir": Path(cfg.resume.dir) if cfg.resume.dir else None,
            "lora": t.model.lora.model_dump() if t.model.lora is not None else None,
            "wandb": cfg.monitors.wandb.model_dump() if cfg.monitors.wandb is not None else None,
        }
        if isinstance(cfg, SFTConfig):
            return cls(**shared, seq_len=cfg.data.seq_len)
        return cls(
            **shared,
            seq_len=t.seq_len,
            loss=t.loss,  # the config's loss class is the trainer's (one default per knob)
            broadcast_keep=broadcast_keep(cfg.orchestrator.max_async_level, cfg.weight_broadcast.keep),
            batch_timeout_s=t.batch_timeout_s,
        )


def load_run_config(run: RunDir) -> RLConfig | SFTConfig:
    """The run's latest resolved config: the ``SFTConfig`` of ``sft.json`` when that file exists, else the
    ``RLConfig`` of ``rl.json``. Raises FileNotFoundError when neither exists, ValidationError on a bad file."""
    from toolkit.config import load_resolved
    from toolkit.config.sft import SFTConfig

    path = run.run_config()
    if path.name == "sft.json":
        return SFTConfig.model_validate(json.loads(path.read_text()))
    return load_resolved(path)


@dataclass
class TrainingStart:
    """What :func:`start_training` set up: rank layout, the (sharded) policy, optimizer, schedule, resume point."""

    info: Any
    device: Any
    model: Any
    optimizer: Any
    scheduler: Any
    model_dir: Path
    n_params: int
    row_cost: Any
    """The model's :class:`toolkit.trainer.packing.RowCost`: micro-batches are packed at its cheapest row width."""
    done: int
    """Last finished step (0 on a fresh start)."""
    resumed: bool
    source: RunDir
    """The run directory the state was loaded from (``resume.dir`` when forking, else the run itself)."""
    keep_last: int | None
    keep_interval: int | None
    parts: tuple[str, ...]

    def micro_batches(self, batch: Any, *, seq_len: int, micro_batch_size: int) -> list:
        """This rank's micro-batches of ``batch`` (:func:`toolkit.trainer.packing.plan_micro_batches`), packed at
        the model's cheapest row width up to ``seq_len``."""
        from toolkit.trainer.packing import plan_micro_batches

        return plan_micro_batches(
            batch,
            seq_len=seq_len,
            micro_batch_size=micro_batch_size,
            rank=self.info.rank,
            world_size=self.info.world_size,
            cost=self.row_cost,
        )

    def save(self, run: RunDir, step: int) -> float:
        """Checkpoint ``step`` (every rank calls this), mark it COMPLETE, apply retention. Returns seconds taken."""
        from toolkit.trainer.checkpoint import save_trainer_state

        t0 = time.perf_counter()
        save_trainer_state(
            run, step, self.model, self.optimizer, self.scheduler, info=self.info, keep_last=self.keep_last
        )
        if self.info.is_main and checkpoints.mark_complete_if_ready(run, step, self.parts):
            checkpoints.apply_retention(run, self.keep_last, self.keep_interval, self.parts)
        return time.perf_counter() - t0


def start_training(run: RunDir, s: TrainerSettings, *, parts: tuple[str, ...] = checkpoints.PARTS) -> TrainingStart:
    """Shared start of the RL and SFT loops: process group, policy (LoRA before sharding), FSDP2, AdamW, the
    learning-rate schedule, and the newest complete checkpoint (or ``resume.step`` / ``resume.dir``) loaded.

    ``parts``: the checkpoint parts a step needs to be complete (RL: trainer and orchestrator; SFT: trainer).
    Raises ``toolkit.checkpoints.CheckpointError`` when checkpoints exist but none can be resumed.
    """
    import socket

    import torch

    from toolkit.models import resolve_model
    from toolkit.trainer import dist as tdist
    from toolkit.trainer.checkpoint import load_trainer_state
    from toolkit.trainer.metrics import num_parameters
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.optim import build_optimizer, build_scheduler
    from toolkit.trainer.packing import RowCost

    info, device = tdist.init_distributed()
    log.info(
        "rank %d of %d (local rank %d) on %s, device %s",
        info.rank,
        info.world_size,
        info.local_rank,
        os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        device,
    )
    torch.manual_seed(s.seed)
    model_dir = resolve_model(s.model_name)
    # LoRA before sharding: every rank draws the same A matrices (seeded above), then FSDP2 shards them like any
    # other parameter; the frozen base weights are sharded too and get no gradient.
    model = load_policy(model_dir, dtype=s.dtype, device=str(device), lora=s.lora)
    n_params = num_parameters(model)
    row_cost = RowCost.of_model(model)  # before sharding: the whole model's shapes
    model = tdist.shard_model(model, info)
    optimizer = build_optimizer(model, lr=s.lr, weight_decay=s.weight_decay, betas=s.betas)
    scheduler = build_scheduler(
        optimizer, kind=s.scheduler, warmup_steps=s.warmup_steps, total_steps=s.max_steps, min_lr_ratio=s.min_lr_ratio
    )
    source = RunDir(s.resume_dir) if s.resume_dir else run
    start = checkpoints.resume_step(source, s.resume_step, parts)
    done = 0
    if start is not None:
        done = load_trainer_state(
            checkpoints.part_dir(source, start, "trainer"), model, optimizer, scheduler, info=info
        )
        log.info("resumed from %s step %d", source.checkpoint_step(start), done)
    return TrainingStart(
        info=info,
        device=device,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        model_dir=Path(model_dir),
        n_params=n_params,
        row_cost=row_cost,
        done=done,
        resumed=start is not None,
        source=source,
        keep_last=s.keep_last,
        keep_interval=s.keep_interval,
        parts=parts,
    )


class TrainerDiverged(RuntimeError):
    """``max_nonfinite_steps`` steps in a row had a NaN/inf loss or gradient (their updates were skipped)."""


class StopFlag:
    """Set by SIGTERM/SIGUSR2 or by the run's STOP file; checked between and during steps."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.signalled: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum

    def __call__(self) -> bool:
        return self.signalled is not None or self.run.stop_request.exists()


def progress_record(run: RunDir) -> Heartbeat:
    """This rank's progress record (``progress/trainer.rank<RANK>.json``, :mod:`toolkit.run.heartbeat`), read by
    the supervisor's watchdog."""
    return Heartbeat(run, "trainer", key=f"trainer.rank{os.environ.get('RANK', '0')}")


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters (the whole model, also when sharded): what a broadcast writes; a
    checkpoint writes about three times as much (weights and the optimizer's two moments)."""
    return int(sum(p.numel() * p.element_size() for p in model.parameters()))


def run_trainer(
    run: RunDir, s: TrainerSettings, *, stop: StopFlag | None = None, progress: Heartbeat | None = None
) -> int:
    """The trainer loop (see module docstring); returns the last finished trainer step. ``progress``: this
    rank's progress record (default :func:`progress_record`), updated at every phase.

    Raises ``toolkit.checkpoints.CheckpointError`` when checkpoints exist but none can be resumed, TimeoutError
    when a batch does not arrive within ``batch_timeout_s``.
    """
    import torch

    from toolkit.batches import read_batch
    from toolkit.run.control import request_stop
    from toolkit.run.metrics import recorded_steps
    from toolkit.trainer import dist as tdist
    from toolkit.trainer.broadcast import broadcast_policy
    from toolkit.trainer.metrics import mfu
    from toolkit.trainer.step import train_step

    unset = [f for f in ("loss", "broadcast_keep", "batch_timeout_s") if getattr(s, f) is None]
    if unset:
        raise ValueError(f"TrainerSettings for an RL run lacks {', '.join(unset)} (build it with from_config)")
    tdist.die_with_agent()
    hb = progress or progress_record(run)
    hb.phase("loading the model and the newest checkpoint", kind=STARTUP)
    st = start_training(run, s)
    info, device, model, optimizer, scheduler = st.info, st.device, st.model, st.optimizer, st.scheduler
    model_dir, n_params, done = st.model_dir, st.n_params, st.done
    stop = stop or StopFlag(run)
    wbytes = weight_bytes(model)

    def waiting() -> bool:  # polled while the trainer waits for a batch: it is alive, not progressing
        hb.beat()
        return stop()

    if info.is_main:
        for d in (run.rollouts, run.broadcasts, run.checkpoints, run.control):
            d.mkdir(parents=True, exist_ok=True)
        fsutil.remove_stale_temps(run.broadcasts)
    tdist.barrier(info)
    last_saved = done if st.resumed and st.source is run else None
    # Steps an earlier attempt trained after its last complete checkpoint are trained again on resume (same
    # batches); their metrics lines already exist, and each step is recorded once.
    recorded = recorded_steps(run.metrics, "trainer") if info.is_main else set()
    mirror = None
    if info.is_main and s.wandb is not None:
        from toolkit.trainer.wandb_mirror import WandbMirror

        mirror = WandbMirror.start(run, s.wandb)

    step = done
    nonfinite = 0  # steps in a row whose update was skipped (NaN/inf loss or gradient)
    diverged = ""
    while step < s.max_steps:
        if tdist.broadcast_flag(stop(), info):
            break
        n = step + 1
        t_wait = time.perf_counter()
        hb.phase(f"waiting for batch {n}", step=n, waiting_for="orchestrator")
        batch = read_batch(run, n, timeout_s=s.batch_timeout_s, should_stop=waiting)
        wait_s = time.perf_counter() - t_wait
        if tdist.broadcast_flag(batch is None, info):
            break
        # The attempt's first step compiles and warms up: a start-up phase for the watchdog.
        hb.phase(
            f"train step {n} (forward, backward, optimizer; collectives)",
            step=n,
            kind=STARTUP if step == done else None,
        )
        mbs = st.micro_batches(batch, seq_len=s.seq_len, micro_batch_size=s.micro_batch_size)
        metrics = train_step(
            model,
            optimizer,
            scheduler,
            mbs,
            loss_cfg=s.loss,
            max_norm=s.max_norm,
            num_samples=batch.num_samples,
            info=info,
            device=device,
            # The trainer holds policy version n - 1 while training step n.
            on_policy=torch.as_tensor(batch.policy_version == n - 1),
        )
        t_bc = time.perf_counter()
        hb.phase(f"weight broadcast {n}", step=n, kind=WEIGHTS, size_bytes=wbytes)
        broadcast_policy(run, n, model, model_dir, info=info, keep=s.broadcast_keep, adapter_only=bool(s.lora))
        tdist.barrier(info)
        bc_s = time.perf_counter() - t_bc
        step = n
        ckpt_s = 0.0
        if (s.ckpt_interval and n % s.ckpt_interval == 0) or n == s.max_steps:
            hb.phase(f"checkpoint {n}", step=n, kind=WEIGHTS, size_bytes=3 * wbytes)
            ckpt_s = st.save(run, n)
            last_saved = n
        hb.phase(f"recording step {n}", step=n)
        if info.is_main:
            m = {"step": n, "time": time.time(), "role": "trainer", **metrics}
            m.update(
                {
                    "time/wait_for_batch": wait_s,
                    "time/broadcast": bc_s,
                    "time/save_ckpt": ckpt_s,
                    "policy_version/min": int(batch.policy_version.min()) if batch.num_samples else n - 1,
                }
            )
            if device.type == "cuda":
                m["perf/mfu"] = mfu(metrics["perf/throughput"], n_params, device, info.world_size)
            if n in recorded:
                log.info("metrics of step %d already recorded by an earlier attempt; not written again", n)
            else:
                fsutil.append_jsonl(run.metrics, m)
            if mirror is not None:
                mirror.pump()  # this line and the orchestrator's lines written since the last step
            log.info("step %d loss %.4g grad_norm %.3g %.2fs", n, m["loss/mean"], m["optim/grad_norm"], m["time/step"])
        nonfinite = nonfinite + 1 if metrics["optim/skipped_update"] else 0
        if nonfinite:
            log.warning(
                "step %d: loss %s / grad norm %s not finite: update skipped (%d in a row, stop at %d)",
                n,
                metrics["loss/mean"],
                metrics["optim/grad_norm"],
                nonfinite,
                s.max_nonfinite_steps,
            )
        if nonfinite >= s.max_nonfinite_steps:
            # Stop the whole run the way a stop request does (the orchestrator saves its part too), so the
            # checkpoint written below, which holds the last finite weights, is complete and resumable.
            diverged = (
                f"loss or gradient not finite for {nonfinite} steps in a row (steps {n - nonfinite + 1}-{n}): the "
                f"run diverged; the checkpoint of step {n} holds the last finite weights. Lower trainer.optim.lr or "
                "check the batches (srl diagnose), then resume."
            )
            if info.is_main:
                request_stop(run, diverged, component="trainer")
            break
    if step > 0 and last_saved != step:
        log.info("stopping after step %d: writing checkpoint", step)
        hb.phase(f"checkpoint {step} (stopping)", step=step, kind=WEIGHTS, size_bytes=3 * wbytes)
        st.save(run, step)
    if mirror is not None:
        # The orchestrator writes the run's last lines (its step line, the final policy's eval) after this
        # trainer's last step: W&B gets them only if the mirror closes after them.
        hb.phase(
            "waiting for the orchestrator's last metrics lines (W&B mirror)", step=step, waiting_for="orchestrator"
        )
        wait_until_finished(run, "orchestrator", on_wait=hb.beat)
        hb.phase("finishing (closing the W&B mirror, leaving the process group)", step=step)
        mirror.close()
    tdist.shutdown(info)
    if diverged:
        raise TrainerDiverged(diverged)
    return step


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="srl trainer", description="RL trainer (started by srl's launchers)")
    p.add_argument("--run-dir", required=True, type=Path, help="run directory (configs/latest/resolved/rl.json)")
    p.add_argument("--resume-step", type=int, default=None, help="resume from this checkpoint step (overrides config)")
    p.add_argument("--resume-dir", type=Path, default=None, help="fork: resume from another run directory")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``srl trainer``. Returns the process exit code (0 also after a stop request)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from toolkit.trainer.sft import run_sft

    run = RunDir(args.run_dir)
    enable_stack_dumps()  # the supervisor's watchdog asks a stuck trainer for its stacks (into this log)
    progress = progress_record(run)
    progress.phase("starting (imports, config)", kind=STARTUP)
    # Started by a supervisor: never train on once it is gone or the run belongs to another attempt.
    exit_when_lease_gone(run, "trainer")
    cfg = load_run_config(run)  # sft.json: the SFT mode of ``srl trainer``
    settings = TrainerSettings.from_config(cfg)
    given = {"resume_step": args.resume_step, "resume_dir": args.resume_dir}  # the command line wins
    settings = dataclasses.replace(settings, **{k: v for k, v in given.items() if v is not None})
    stop = StopFlag(run)
    stop.install()
    if run.run_config().name == "sft.json":
        return _exit_status(lambda: run_sft(run, cfg, settings, stop=stop, progress=progress))
    return _exit_status(lambda: run_trainer(run, settings, stop=stop, progress=progress))


def _exit_status(loop: Any) -> int:
    """Run ``loop`` and map how it ended to the process's exit status: 0 done (or stopped on request), 1 a full
    disk or a diverged run, 2 bad SFT data; each said plainly in the log (the launcher ends the run)."""
    from toolkit.trainer.checkpoint import CheckpointSpaceError
    from toolkit.trainer.sft_data import DataError

    try:
        loop()
    except CheckpointSpaceError as e:
        log.error("%s", e.strerror)
        return 1
    except (DataError, TrainerDiverged) as e:
        log.error("%s: %s", type(e).__name__, e)
        return 2 if isinstance(e, DataError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
