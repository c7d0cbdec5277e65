"""The SFT loop of the trainer: ``srl trainer --run-dir DIR`` runs it when the run's resolved config is ``sft.json``.

Same machinery as RL (:func:`toolkit.trainer.main.start_training`: model loading, LoRA, FSDP2 under torchrun,
AdamW and schedule, checkpoints with COMPLETE markers, resume, the NaN guard, the stop flag) and the same train
step: an SFT batch is a trainer batch whose CE mask marks the trained tokens and that has no RL tokens, so the
step's loss is the masked negative log-likelihood (:mod:`toolkit.trainer.loss`)::

    loss = -(1 / N) * sum over trained tokens t of log p(y_t | y_<t)

with ``N`` the number of trained tokens of the whole step (all micro-batches, all ranks): every trained token
weighs the same, whatever the packing or sharding.

Per step n: the samples of :func:`toolkit.trainer.sft_data.step_rows` are packed into rows of at most
``data.seq_len`` tokens (positions restart per sample, so no attention crosses samples; the row width costing the
least compute, :func:`toolkit.trainer.packing.row_width`), one optimizer step is taken, a metrics line is appended
(``loss/mean``, ``loss/perplexity``, ``optim/lr``, ``optim/grad_norm``, ``progress/epoch``,
``progress/num_samples``, ``progress/num_tokens``, ``perf/throughput``; ``val/loss`` and ``val/perplexity`` every
``val.interval`` steps and at the end) and the step's sample ids go to ``data_order.jsonl``. With an online eval
(``[eval]`` envs), the weights of every ``eval.interval``-th step and of the last step are broadcast
(``broadcasts/step_<n>/``, STABLE last) for the eval-only orchestrator, which evaluates them through vLLM. Checkpoints
(every ``ckpt.interval`` steps and at the end) carry the weights as a Hugging Face directory (``hf/``) beside the
trainer state; the end also writes ``<run>/model/``, which ``srl rl`` takes as ``model.name``.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit import fsutil
from toolkit.checkpoints import SFT_PARTS as PARTS
from toolkit.run.layout import RunDir

if TYPE_CHECKING:
    from toolkit.config.sft import SFTConfig

log = logging.getLogger("srl.trainer.sft")


def load_data(cfg: SFTConfig, model_dir: Path) -> tuple[Any, Any | None]:
    """Tokenized train and validation data of an SFT config (validation None without ``[val]``).

    Without ``val.data``, ``val.fraction`` of the rows (at least one, at most all but one) is held out, chosen by
    ``seed``; the rest trains. Raises ``toolkit.trainer.sft_data.DataError`` naming the file, row and column.
    """
    from toolkit.models.renderer import load_renderer
    from toolkit.trainer.sft_data import DataError, SFTData, load_conversations

    renderer = load_renderer(cfg.renderer, model_dir)

    def build(d: Any) -> SFTData:
        convs, wheres = load_conversations(d.name, d.columns)
        return SFTData.build(
            convs, renderer, cfg.loss_mask, seq_len=cfg.data.seq_len, source=str(d.name), wheres=wheres
        )

    data = build(cfg.data)
    val = None
    if cfg.val is not None:
        if cfg.val.data is not None:
            val = build(cfg.val.data)
        else:
            if len(data) < 2:
                raise DataError(
                    f"{cfg.data.name}: {len(data)} row(s) cannot be split into train and validation; "
                    "give [val.data] or more rows"
                )
            n_val = min(len(data) - 1, max(1, round(cfg.val.fraction * len(data))))
            perm = np.random.default_rng([cfg.seed, 1_000_003]).permutation(len(data))
            val, data = data.subset(np.sort(perm[:n_val])), data.subset(np.sort(perm[n_val:]))
        if cfg.val.max_samples is not None and len(val) > cfg.val.max_samples:
            val = val.subset(np.arange(cfg.val.max_samples))
    return data, val


def validation_loss(model: Any, mbs: list, *, info: Any, device: Any) -> float:
    """Mean NLL (nats per trained token) under ``model`` of the validation rows in this rank's micro-batches
    ``mbs``, no gradient; the same on every rank."""
    import torch

    from toolkit.trainer.step import _all_reduce_sum, token_logprobs

    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for mb in mbs:
            mb = mb.to(device)
            lp, _ = token_logprobs(model, mb, with_entropy=False)
            total[0] -= torch.where(mb.ce_mask, lp, torch.zeros_like(lp)).sum().double()
            total[1] += mb.ce_mask.sum()
    model.train()
    total = _all_reduce_sum(total, info)
    return float(total[0] / max(float(total[1]), 1.0))


def export_model(model: Any, model_dir: Path, final: Path, *, info: Any) -> None:
    """Write the (gathered, LoRA-merged) weights with config and tokenizer as a HF directory at ``final``
    (atomically). Every rank calls this; only the main rank writes."""
    from toolkit.trainer.broadcast import model_config_dict, write_hf_dir
    from toolkit.trainer.model import full_state_dict

    weights = full_state_dict(model, info=info)
    if info.is_main:  # a retrained step after a resume replaces the earlier attempt's export
        write_hf_dir(final, weights, model_config_dict(model), model_dir, marker=None)


def check_resumed_order(run: RunDir, samples_of: Any) -> None:
    """Raise DataError when the newest step of ``data_order.jsonl`` lists other samples than ``samples_of(step)``
    (the sample ids this attempt's data, batch size, seed and split give that step).

    A resumed run trains step ``n`` on samples chosen from the step alone; when the dataset file, ``data.batch_size``,
    ``seed``, ``data.shuffle`` or the validation split changed between attempts, the same step picks other samples
    and the run would go on training on a sequence no uninterrupted run sees, without a word. Checked on every rank
    (the file is in the shared run directory), so all ranks stop together.
    """
    from toolkit.run.metrics import records
    from toolkit.trainer.sft_data import DataError

    steps = [rec for rec in records(run.data_order) if isinstance(rec.get("step"), int)]
    if not steps:
        return
    last = max(reversed(steps), key=lambda rec: rec["step"])  # the newest line of the highest step
    now = samples_of(last["step"])
    if list(last.get("samples") or []) != list(now):
        raise DataError(
            f"--resume: step {last['step']} trained samples {last.get('samples', [])[:3]}... "
            f"({run.data_order}), but this attempt's data gives {list(now)[:3]}...: the dataset, "
            "data.batch_size, data.shuffle, seed or the validation split changed since the run started. "
            "Restore them to resume, or start a new run from this one's weights (model.name = "
            f"{run.checkpoints}/step_<n>/hf)"
        )


def run_sft(run: RunDir, cfg: SFTConfig, s: Any, *, stop: Any, progress: Any = None) -> int:
    """The SFT loop (module docstring) of ``cfg`` (an ``SFTConfig``) with its trainer settings ``s``
    (``TrainerSettings.from_config(cfg)``, resume overrides applied); returns the last finished step.
    ``progress``: this rank's progress record (``toolkit.run.heartbeat.Heartbeat``; default: a new one).

    Raises DataError before step 1 on bad data, ``toolkit.checkpoints.CheckpointError`` when checkpoints exist but
    none can be resumed, TrainerDiverged after ``max_nonfinite_steps`` non-finite steps in a row.
    """
    from toolkit.run.heartbeat import STARTUP, WEIGHTS, wait_until_finished
    from toolkit.run.metrics import recorded_steps
    from toolkit.trainer import dist as tdist
    from toolkit.trainer.loss import IPOLoss
    from toolkit.trainer.main import TrainerDiverged, progress_record, start_training, weight_bytes
    from toolkit.trainer.sft_data import step_rows, to_batch
    from toolkit.trainer.step import train_step

    tdist.die_with_agent()
    hb = progress or progress_record(run)
    hb.phase("loading the model, the newest checkpoint and the data", kind=STARTUP)
    st = start_training(run, s, parts=PARTS)
    info, device, model = st.info, st.device, st.model
    wbytes = weight_bytes(model)
    t_data = time.perf_counter()
    data, val = load_data(cfg, st.model_dir)
    if info.is_main:
        log.info(
            "data: %d training samples (%d tokens, %d trained) from %s; %s validation samples; %.1fs",
            len(data),
            data.num_tokens,
            int(data.loss_mask.sum()),
            cfg.data.name,
            len(val) if val is not None else "no",
            time.perf_counter() - t_data,
        )
        for d in (run.checkpoints, run.control):
            d.mkdir(parents=True, exist_ok=True)
    tdist.barrier(info)
    d = cfg.data
    lengths = data.lengths()

    def rows_of(step: int) -> tuple[np.ndarray, float]:
        return step_rows(len(data), batch_size=d.batch_size, step=step, seed=cfg.seed, shuffle=d.shuffle)

    done = st.done
    if st.resumed and st.source is run:
        check_resumed_order(run, lambda k: [data.sample_ids[r] for r in rows_of(k)[0]])
    # Tokens trained by earlier steps (progress/num_tokens is cumulative): recomputed from the data order.
    num_tokens = sum(int(lengths[rows_of(k)[0]].sum()) for k in range(1, done + 1))
    recorded = recorded_steps(run.metrics, "trainer") if info.is_main else set()
    last_saved = done if st.resumed and st.source is run else None
    mirror = None
    if info.is_main and s.wandb is not None:
        from toolkit.trainer.wandb_mirror import WandbMirror

        mirror = WandbMirror.start(run, s.wandb)

    def checkpoint(step: int) -> float:
        t0 = time.perf_counter()
        export_model(model, st.model_dir, run.checkpoint_hf(step), info=info)
        st.save(run, step)
        return time.perf_counter() - t0

    def broadcast(step: int) -> float:
        # Online eval: the eval-only orchestrator loads this into inference and evaluates it. Four eval points are
        # kept, so it evaluates each point's own weights even when its evals (or the engine's start-up) fall behind.
        from toolkit.trainer.broadcast import broadcast_policy

        t0 = time.perf_counter()
        broadcast_policy(run, step, model, st.model_dir, info=info, keep=4)
        tdist.barrier(info)
        return time.perf_counter() - t0

    eval_every = cfg.eval.interval if cfg.has_online_eval else 0
    if info.is_main and cfg.has_online_eval:
        run.broadcasts.mkdir(parents=True, exist_ok=True)
        fsutil.remove_stale_temps(run.broadcasts)

    def validate() -> dict[str, float]:  # called only with [val], for which load_data always gives data
        rows = st.micro_batches(
            to_batch(val, np.arange(len(val)), step=0), seq_len=d.seq_len, micro_batch_size=s.micro_batch_size
        )
        v = validation_loss(model, rows, info=info, device=device)
        return {"val/loss": v, "val/perplexity": math.exp(min(v, 80.0))}

    step = done
    nonfinite = 0
    loss_cfg = IPOLoss()  # no RL tokens in an SFT batch: only the CE term contributes
    while step < s.max_steps:
        if tdist.broadcast_flag(stop(), info):
            break
        n = step + 1
        hb.phase(f"train step {n}", step=n, kind=STARTUP if step == done else None)  # the first step compiles
        rows, epoch = rows_of(n)
        batch = to_batch(data, rows, n)
        mbs = st.micro_batches(batch, seq_len=d.seq_len, micro_batch_size=s.micro_batch_size)
        metrics = train_step(
            model,
            st.optimizer,
            st.scheduler,
            mbs,
            loss_cfg=loss_cfg,
            max_norm=s.max_norm,
            num_samples=batch.num_samples,
            info=info,
            device=device,
        )
        num_tokens += batch.num_tokens
        step = n
        ckpt_s = 0.0
        if (s.ckpt_interval and n % s.ckpt_interval == 0) or n == s.max_steps:
            hb.phase(f"checkpoint {n}", step=n, kind=WEIGHTS, size_bytes=4 * wbytes)  # with its HF weights
            ckpt_s = checkpoint(n)
            last_saved = n
        hb.phase(f"after step {n}: broadcast, validation, metrics", step=n, kind=WEIGHTS, size_bytes=wbytes)
        bc_s = (
            broadcast(n) if cfg.has_online_eval and ((eval_every and n % eval_every == 0) or n == s.max_steps) else 0.0
        )
        extra = validate() if cfg.val is not None and (n % cfg.val.interval == 0 or n == s.max_steps) else {}
        if info.is_main:
            loss = metrics["loss/mean"]
            m = {
                "step": n,
                "time": time.time(),
                "role": "trainer",
                "loss/mean": loss,
                "loss/perplexity": math.exp(min(loss, 80.0)) if math.isfinite(loss) else loss,
                "optim/lr": metrics["optim/lr"],
                "optim/grad_norm": metrics["optim/grad_norm"],
                "optim/skipped_update": metrics["optim/skipped_update"],
                "progress/epoch": epoch,
                "progress/num_samples": n * d.batch_size,
                "progress/num_tokens": num_tokens,
                "train/ce_tokens": int(batch.ce_mask.sum()),
                "perf/throughput": metrics["perf/throughput"],
                "perf/peak_memory": metrics["perf/peak_memory"],
                "perf/packing_efficiency": metrics["perf/packing_efficiency"],
                "time/step": metrics["time/step"],
                "time/save_ckpt": ckpt_s,
                "time/broadcast": bc_s,
                **extra,
            }
            if n in recorded:
                log.info("metrics of step %d already recorded by an earlier attempt; not written again", n)
            else:
                fsutil.append_jsonl(run.metrics, m)
                fsutil.append_jsonl(run.data_order, {"step": n, "samples": [data.sample_ids[r] for r in rows]})
            if mirror is not None:
                mirror.pump()  # this step's line and the eval lines written since the last step
            log.info(
                "step %d loss %.4g grad_norm %.3g lr %.3g epoch %.2f %.2fs%s",
                n,
                loss,
                m["optim/grad_norm"],
                m["optim/lr"],
                epoch,
                m["time/step"],
                f" val/loss {extra['val/loss']:.4g}" if extra else "",
            )
        nonfinite = nonfinite + 1 if metrics["optim/skipped_update"] else 0
        if nonfinite >= s.max_nonfinite_steps:
            if step > 0 and last_saved != step:
                checkpoint(step)
            tdist.shutdown(info)
            raise TrainerDiverged(
                f"loss or gradient not finite for {nonfinite} steps in a row (steps {n - nonfinite + 1}-{n}); the "
                f"checkpoint of step {n} holds the last finite weights. Lower trainer.optim.lr or check the data."
            )
    if step > 0 and last_saved != step:
        log.info("stopping after step %d: writing checkpoint", step)
        hb.phase(f"checkpoint {step} (stopping)", step=step, kind=WEIGHTS, size_bytes=4 * wbytes)
        checkpoint(step)
    if step >= s.max_steps:
        hb.phase("writing the final model", step=step, kind=WEIGHTS, size_bytes=wbytes)
        export_model(model, st.model_dir, run.model_export, info=info)
        if info.is_main:
            log.info("final model written to %s", run.model_export)
    if mirror is not None and cfg.has_online_eval:
        # The eval-only orchestrator writes the last step's eval after this broadcast: wait for it to finish so
        # W&B gets the run's final score too.
        hb.phase("waiting for the orchestrator's last eval (W&B mirror)", step=step, waiting_for="orchestrator")
        wait_until_finished(run, "orchestrator", on_wait=hb.beat)
    hb.phase("finishing (W&B mirror, leaving the process group)", step=step)
    if mirror is not None:
        mirror.close()
    tdist.shutdown(info)
    return step
