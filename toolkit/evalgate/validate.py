"""``srl eval validate``: the model-free half of the first-run gate (scoring is checked before any training
starts, not discovered broken during it).

For every train and eval env of a run config (or the ones named with ``--env``), on its first ``n`` selected tasks:

- ``taskset_loads``: the taskset builds with the workers' fields and runtime, ``select`` yields tasks, nothing in
  it is refused (``toolkit.envs.fidelity``), task ids are unique (named as verifiers names tasks: ``id``, else
  ``name``, else ``idx``; keys as verifiers derives them);
- ``known_successes``: verifiers' own gold check per task (``Task.validate(runtime)`` after ``setup`` in a fresh
  runtime, run by verifiers' validate code): False, a raise or a timeout FAILs; None is "unchecked", as verifiers
  says. Only for an unchecked task srl adds its reference replies: a declared reference (srl's
  ``reference_replies()`` hook, a built-in's answer) must score at least ``success_min`` (default 1.0) or FAILs; a
  guessed one (``data.answer`` replayed as the reply, which a task may expect wrapped in tags) that scores lower
  leaves the task unchecked. All tasks unchecked is a WARN naming what to define, never a FAIL;
- ``known_failures``: verifiers' own noop check (the untouched task, set up, finalized and scored with no turn,
  must score below 1.0), then an empty reply, a wrong one (another task's reference) and a malformed one (markup
  and control characters) each score below ``success_min``, the empty reply at most ``failure_max`` (default 0.0),
  and none as high as a reference that succeeded;
- ``deterministic_scoring``: every reply above scores the same twice (reward and each component), and reloading
  the taskset gives the same tasks (ids, prompts, content hashes);
- ``bounded_limits``: ``max_turns`` lets the reference finish, the per-rollout token budget fits the engine's
  ``max_model_len``, and the slowest scoring measured here stays under half the ``scoring`` stage timeout.

An env that training runs through verifiers' own rollout (tools, hooks, an Env class or harness of its own:
``toolkit.envs.fidelity.chat_loop_reasons``) gets verifiers' checks only (gold and noop, and the reload check): its
replies cannot be replayed without a model, so no srl reply case runs and ``taskset_loads`` says so.

Replies are scored in this process by the same ``Episode`` the env workers run (``toolkit.envs.episode``), turn by
turn through the task's ``user_turn`` hook, with the env's ``max_turns``; async stages are bounded by the env's
``setup`` and ``scoring`` timeouts (a CPU-bound hang cannot be interrupted in-process; ``srl eval run`` exercises
the worker path, which kills such workers).

Reference solutions (:func:`reference_replies`, used only for tasks without their own ``validate``), in order: the
task's own ``reference_replies()`` method (srl's hook: one reply per turn), ``data.answer`` (single turn), or a
known built-in shape (alphabet-sort's ``turns``). A task with neither fails ``known_successes`` with the fix named.

Tasks are imported from the same path as the workers: the config's ``env_vars.PYTHONPATH`` (run and orchestrator)
is put in front of ``sys.path`` and of this process's ``PYTHONPATH`` (programs a runtime starts) while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from toolkit.envs.fidelity import task_identity
from toolkit.run.verdict import GateItem, Verdict

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig


# A reply no verifier should accept: chat-template markup, JSON debris, control and replacement characters.
MALFORMED_REPLY = "<|im_end|>}{\x00\ufffd ### [[ ]] \t\n<|endoftext|>"
_EPS = 1e-9


def reference_replies(task: Any) -> list[str] | None:
    """The assistant replies (one per turn) of a known-correct solution of ``task``, or None when unknown."""
    hook = getattr(task, "reference_replies", None)
    if callable(hook):
        return [str(r) for r in hook()]
    data = task.data
    answer = getattr(data, "answer", None)
    if answer is not None:
        return [str(answer)]
    turns = getattr(data, "turns", None)
    if isinstance(turns, list) and turns and all(isinstance(t, list) for t in turns):
        from toolkit.envs.tasksets.alphabet_sort import expected_lists

        return ["\n".join(names) for names in expected_lists(turns)]
    return None


def reference_is_declared(task: Any) -> bool:
    """Whether ``task``'s reference replies are declared as replies (srl's ``reference_replies()`` hook, or a
    built-in shape such as alphabet-sort's ``turns``), not guessed from ``data.answer``, which a task may expect
    wrapped (tags, JSON)."""
    if callable(getattr(task, "reference_replies", None)) or type(task).__module__.startswith("toolkit.envs.tasksets"):
        return True  # srl's built-ins answer with exactly data.answer
    return getattr(task.data, "answer", None) is None


async def verifiers_checks(
    tasks: Sequence[Any], runtime_config: Any, *, setup_s: float | None, total_s: float | None
) -> dict[str, list[dict[str, Any]]]:
    """verifiers' own model-free checks of each task, as ``vf-validate`` runs them: ``gold`` (``Task.validate``
    after ``setup``, in a fresh runtime) and ``noop`` (``setup``, ``finalize`` and scoring of the untouched task; it
    must not reach 1.0). Returns ``{"gold": [row, ...], "noop": [row, ...]}``, one row per task in order, each
    verifiers' own result row (``reason`` one of valid, invalid, unchecked, error, timeout; ``error``; noop rows
    also ``reward``). ``setup_s``/``total_s``: seconds for ``setup`` and for the check after it. Raises nothing a
    task raises (verifiers records it as ``error``).
    """
    from verifiers.v1.cli import validate as vf_validate
    from verifiers.v1.configs.cli.validate import CheckTimeoutConfig, ValidateConfig

    config = ValidateConfig(
        runtime=runtime_config, timeout=CheckTimeoutConfig(setup=setup_s, total=total_s), rich=False
    )
    # The per-task check is verifiers' own; its public entry (run_validate) would load the taskset by id, which
    # srl's built-ins and the config's field mapping do not go through.
    return {mode: [await vf_validate._run_check(t, config, mode) for t in tasks] for mode in ("gold", "noop")}


async def score_replies(
    task: Any,
    replies: Sequence[str],
    *,
    max_turns: int | None,
    setup_s: float | None,
    scoring_s: float | None,
    turn_s: float | None = None,
    runtime_config: Any = None,
) -> dict[str, Any]:
    """Play ``replies`` as the assistant's turns of one fresh episode of ``task`` and score it.

    Stops when the episode is done, when ``max_turns`` is reached, or when the replies run out (the task then
    ``wanted_more``). Returns ``{"reward", "components", "turns", "wanted_more", "scoring_s"}`` (seconds).
    Raises an ``SrlRolloutError`` (TaskError for task code) or asyncio.TimeoutError after ``setup_s`` /
    ``scoring_s`` seconds, or when one turn (the task's ``user_turn``) takes longer than ``turn_s`` seconds.
    ``runtime_config``: verifiers' runtime config the env's workers use (default subprocess); the episode's runtime
    is stopped whatever happens.
    """
    from toolkit.envs.episode import Episode

    ep = Episode(task, max_turns=max_turns, runtime_config=runtime_config)
    try:
        await asyncio.wait_for(ep.start(), setup_s)
        done = False
        for reply in replies:
            # A user turn that never returns would hang the gate: the rollout timeout bounds it, as in the workers.
            _, done = await asyncio.wait_for(ep.step(reply), turn_s)
            if done:
                break
        t0 = time.perf_counter()
        await asyncio.wait_for(ep.finalize(), scoring_s)
        scored = await asyncio.wait_for(ep.score(), scoring_s)
    finally:
        await ep.close()
    return {
        **scored,
        "turns": ep.turns,
        "wanted_more": ep.wants_more or not done,
        "scoring_s": time.perf_counter() - t0,
    }


def _failure_cases(i: int, refs: list[list[str] | None]) -> dict[str, list[str]]:
    """Known-failure replies for task ``i``: empty, wrong (another task's different reference) and malformed."""
    own = refs[i] or [""]
    wrong = next((r for j, r in enumerate(refs) if j != i and r and r != own), None)
    if wrong is None:  # one task, or all references equal: a reply that differs from the reference
        wrong = [("x" + r[::-1]) if r else "x" for r in own]
    return {"empty": [""] * len(own), "wrong": list(wrong), "malformed": [MALFORMED_REPLY] * len(own)}


def _task_fingerprint(tasks: Sequence[Any]) -> list[tuple[str, str, str]]:
    return [(task_identity(t), str(t.data.prompt), str(t.hash)) for t in tasks]


async def _validate_env_async(
    env: Any,
    *,
    n: int,
    success_min: float,
    failure_max: float,
    max_model_len: int | None,
    sampling_max_tokens: int | None,
    kind: str = "train",
) -> list[GateItem]:
    from toolkit.envs import fidelity
    from toolkit.envs.registry import load_selected, split_fields, taskset_module, taskset_source

    name = env.name
    t0 = time.perf_counter()

    try:
        # The rows the env's workers load: same fields, same eval-split rule.
        taskset, all_tasks = load_selected(env.taskset, env_name=name, eval_env=kind == "eval")
    except Exception as exc:  # noqa: BLE001 - any failure to build the taskset is the finding itself
        return [
            GateItem(
                "taskset_loads",
                name,
                "FAIL",
                f"taskset {env.taskset.id!r} failed to load: {type(exc).__name__}: {exc}",
                {"taskset": env.taskset.id},
            )
        ]
    load_s = time.perf_counter() - t0
    tasks = all_tasks[:n]
    ids = [task_identity(t) for t in all_tasks]
    dupes = sorted(x for x, c in Counter(ids).items() if c > 1)[:5]
    key_counts = Counter(t.key for t in all_tasks)
    twins = sorted({ids[i] for i, t in enumerate(all_tasks) if key_counts[t.key] > 1})[:5]
    ev = {
        "taskset": env.taskset.id,
        "split": split_fields(taskset.config),
        "tasks_selected": len(all_tasks),
        "tasks_checked": len(tasks),
        "first_ids": ids[:3],
        "load_s": round(load_s, 3),
    }
    try:
        runtime_config = fidelity.build_runtime_config(name, fidelity.runtime_fields(env.harness.runtime))
        ev["source"] = taskset_source(env.taskset.id).describe()
        module = taskset_module(env.taskset.id)
        # What sends the env to verifiers' own rollout in training (tools, hooks, its own Env...): replies cannot
        # be replayed through the plain chat loop then, so only verifiers' own checks run (no model here).
        trace_reasons = fidelity.chat_loop_reasons(name, taskset, all_tasks, env.harness.id, module)
        if not trace_reasons:
            fidelity.check_loaded(name, taskset, all_tasks, env.harness.id, runtime_config, module=module)
    except fidelity.EnvFeatureError as exc:
        return [GateItem("taskset_loads", name, "FAIL", str(exc), ev)]
    replay = not trace_reasons
    ev["runs_through"] = "srl's chat loop" if replay else "verifiers' own rollout"
    if trace_reasons:
        ev["why_verifiers_rollout"] = trace_reasons[:3]
    if not tasks:
        return [GateItem("taskset_loads", name, "FAIL", "the taskset yields no tasks after select", ev)]
    items: list[GateItem] = []
    if twins:
        items.append(
            GateItem(
                "taskset_loads",
                name,
                "FAIL",
                f"task keys (Task.key, verifiers' identity) are not unique: {twins} carry the same key",
                ev,
            )
        )
    elif dupes:
        items.append(GateItem("taskset_loads", name, "FAIL", f"task ids are not unique (e.g. {dupes})", ev))
    elif len(tasks) < n:
        items.append(GateItem("taskset_loads", name, "WARN", f"only {len(tasks)} tasks (asked for {n})", ev))
    else:
        how = (
            ""
            if replay
            else (
                "; it runs through verifiers' own rollout, so only verifiers' own checks run here "
                "(no reply is replayed)"
            )
        )
        items.append(GateItem("taskset_loads", name, "PASS", f"{len(all_tasks)} tasks, checked {len(tasks)}{how}", ev))

    timeout = env.timeout
    kw = {
        "max_turns": env.max_turns,
        "setup_s": timeout.setup,
        "scoring_s": timeout.scoring,
        "turn_s": timeout.rollout,
        "runtime_config": runtime_config,
    }

    async def score(task: Any, replies: list[str]) -> dict[str, Any]:
        try:
            return await score_replies(task, replies, **kw)
        except TimeoutError:
            return {
                "error": f"timed out (setup {timeout.setup} s / turn {timeout.rollout} s / scoring {timeout.scoring} s)"
            }
        except Exception as exc:  # noqa: BLE001 - TaskError and anything the task raised: evidence, not a crash of the gate
            return {"error": f"{type(exc).__name__}: {exc}"}

    # -- verifiers' own per-task checks: gold (Task.validate) and noop (the untouched task must not pass) ---------
    checks = await verifiers_checks(tasks, runtime_config, setup_s=timeout.setup, total_s=timeout.scoring)
    vf_counts = {mode: dict(Counter(row["reason"] for row in rows)) for mode, rows in checks.items()}

    # -- known successes: verifiers' gold verdict; srl's reference replies only where gold is unchecked -----------
    refs = [
        None if not replay or checks["gold"][i]["reason"] != "unchecked" else reference_replies(t)
        for i, t in enumerate(tasks)
    ]
    scored: dict[tuple[int, str], tuple[list[str], dict[str, Any]]] = {}
    bad_gold = [
        {"task": task_identity(t), "verifiers": row["reason"], "error": row["error"]}
        for t, row in zip(tasks, checks["gold"], strict=True)
        if row["reason"] not in ("valid", "unchecked")
    ]
    bad_success: list[dict[str, Any]] = []
    unchecked: list[str] = []
    for i, (task, ref) in enumerate(zip(tasks, refs, strict=True)):
        if checks["gold"][i]["reason"] != "unchecked":
            continue
        if ref is None:
            unchecked.append(task_identity(task))
            continue
        s = await score(task, ref)
        scored[(i, "reference")] = (ref, s)
        if "error" not in s and s["reward"] >= success_min - _EPS:
            continue
        if reference_is_declared(task):
            bad_success.append({"task": task_identity(task), "reply": ref, **_brief(s)})
        else:
            # data.answer is a guess at the reply; a task may want it wrapped (tags, JSON). verifiers calls such a
            # task unchecked, and so does srl.
            unchecked.append(task_identity(task))
    validated = vf_counts["gold"].get("valid", 0)
    ref_ok = [
        s["reward"]
        for (_, case), (_, s) in scored.items()
        if case == "reference" and "error" not in s and s["reward"] >= success_min - _EPS
    ]
    sev = {
        "verifiers": vf_counts,
        "validated": validated,
        "reward_min": min(ref_ok, default=None),
        "reward_max": max(ref_ok, default=None),
    }
    if bad_gold or bad_success:
        gold_what = f"{len(bad_gold)} Task.validate(runtime) check(s) returned False, raised or timed out"
        what = [f"{gold_what} (verifiers' gold check)"] if bad_gold else []
        what += [f"{len(bad_success)} declared reference solution(s) score below {success_min}"] if bad_success else []
        items.append(
            GateItem(
                "known_successes",
                name,
                "FAIL",
                f"{'; '.join(what)} (of {len(tasks)} tasks)",
                {**sev, "examples": (bad_gold + bad_success)[:3], "success_min": success_min},
            )
        )
    elif unchecked and not validated and not ref_ok:
        if replay:
            why = (
                f"verifiers: Task.validate returned None; no reference reply srl knows scores {success_min}); "
                "define `Task.validate(runtime)` or a `reference_replies()` method"
            )
        else:
            why = (
                "verifiers: Task.validate returned None); define `Task.validate(runtime)` (an env on verifiers' "
                "own rollout gets no replayed replies)"
            )
        items.append(
            GateItem(
                "known_successes",
                name,
                "WARN",
                f"unchecked: none of the {len(tasks)} tasks has a model-free success check ({why}",
                {**sev, "tasks": unchecked[:5]},
            )
        )
    else:
        what = [f"{validated} pass Task.validate(runtime)"] if validated else []
        what += [f"{len(ref_ok)} reference solutions score >= {success_min}"] if ref_ok else []
        what += [f"{len(unchecked)} unchecked"] if unchecked else []
        items.append(GateItem("known_successes", name, "PASS", "; ".join(what), sev))

    # -- known failures: verifiers' noop check, then empty, wrong and malformed replies ----------------------------
    bad_fail: list[dict[str, Any]] = [
        {
            "task": task_identity(t),
            "case": "untouched",
            "verifiers": row["reason"],
            **({"reward": row.get("reward")} if row["reason"] == "invalid" else {"error": row["error"]}),
        }
        for t, row in zip(tasks, checks["noop"], strict=True)
        if row["reason"] not in ("valid", "unchecked")
    ]
    fail_rewards: dict[str, list[float]] = {"empty": [], "wrong": [], "malformed": []}
    for i, task in enumerate(tasks if replay else []):
        ref_reward = scored.get((i, "reference"), ([], {}))[1].get("reward")
        if ref_reward is not None and ref_reward < success_min - _EPS:
            ref_reward = None  # a reference that is not a success says nothing about what a failure may score
        for case, replies in _failure_cases(i, refs).items():
            s = await score(task, replies)
            scored[(i, case)] = (replies, s)
            if "error" in s:
                bad_fail.append({"task": task_identity(task), "case": case, **_brief(s)})
                continue
            fail_rewards[case].append(s["reward"])
            ok = s["reward"] <= failure_max + _EPS if case == "empty" else s["reward"] < success_min - _EPS
            if ok and ref_reward is not None and s["reward"] >= ref_reward - _EPS:
                ok = False  # a failure must never score like the reference
            if not ok:
                bad_fail.append({"task": task_identity(task), "case": case, "reply": replies, **_brief(s)})
    fev = {case: {"max": max(v), "mean": round(sum(v) / len(v), 4)} for case, v in fail_rewards.items() if v}
    fev["verifiers"] = vf_counts["noop"]
    if bad_fail:
        cases = sorted({b["case"] for b in bad_fail})
        items.append(
            GateItem(
                "known_failures",
                name,
                "FAIL",
                f"{len(bad_fail)} known-failure case(s) ({', '.join(cases)}) scored like a success "
                f"or raised (the untouched task must score below 1.0 (verifiers' noop check), an "
                f"empty reply <= {failure_max}, others < {success_min})",
                {"cases": cases, "examples": bad_fail[:3], **fev},
            )
        )
    elif replay:
        items.append(
            GateItem(
                "known_failures",
                name,
                "PASS",
                f"untouched < 1.0, empty <= {failure_max}, wrong and malformed < {success_min} on {len(tasks)} tasks",
                fev,
            )
        )
    else:
        items.append(
            GateItem(
                "known_failures",
                name,
                "PASS",
                f"untouched < 1.0 on {len(tasks)} tasks (verifiers' noop check; no reply replayed)",
                fev,
            )
        )

    # -- determinism: score everything again, reload the taskset ------------------------------------------------
    diffs: list[dict[str, Any]] = []
    # Per task: the reference first, then the failure cases (a stable sort keeps each task's scoring order).
    for (i, case), (replies, before) in sorted(scored.items(), key=lambda kv: kv[0][0]):
        if "error" in before:
            continue
        again = await score(tasks[i], replies)
        if "error" in again or again["reward"] != before["reward"] or again["components"] != before["components"]:
            diffs.append(
                {"task": task_identity(tasks[i]), "case": case, "first": _brief(before), "second": _brief(again)}
            )
    try:
        reloaded = load_selected(env.taskset, env_name=name, eval_env=kind == "eval")[1]
        reload_same = _task_fingerprint(reloaded[:n]) == _task_fingerprint(tasks)
    except Exception as exc:  # noqa: BLE001 - a taskset that loads once but not twice is nondeterministic too
        reload_same = False
        diffs.append({"reload": f"{type(exc).__name__}: {exc}"})
    if diffs or not reload_same:
        what = [f"{len(diffs)} repl(ies) scored differently on a second scoring"] if diffs else []
        what += [] if reload_same else ["reloading the taskset gave different tasks"]
        items.append(
            GateItem(
                "deterministic_scoring",
                name,
                "FAIL",
                "; ".join(what),
                {"examples": diffs[:3], "tasks_reload_identically": reload_same},
            )
        )
    else:
        rescored = sum("error" not in s for _, s in scored.values())
        items.append(
            GateItem(
                "deterministic_scoring",
                name,
                "PASS",
                ("every reply scored identically twice; " if rescored else "") + "the taskset reloads identically",
                {"replies_rescored": rescored},
            )
        )

    # -- bounded limits -----------------------------------------------------------------------------------------
    items.append(_bounded_limits(env, refs, [s for _, s in scored.values()], max_model_len, sampling_max_tokens))
    return items


def _brief(s: dict[str, Any]) -> dict[str, Any]:
    if "error" in s:
        return {"error": s["error"]}
    return {"reward": s["reward"], "components": s["components"], "turns": s["turns"]}


def _bounded_limits(
    env: Any,
    refs: list[list[str] | None],
    scores: list[dict[str, Any]],
    max_model_len: int | None,
    sampling_max_tokens: int | None,
) -> GateItem:
    t = env.timeout
    scoring_times = [s["scoring_s"] for s in scores if "scoring_s" in s]
    need_turns = max((len(r) for r in refs if r), default=1)
    ev: dict[str, Any] = {
        "max_turns": env.max_turns,
        "reference_turns_max": need_turns,
        "max_total_tokens": env.max_total_tokens,
        "max_completion_tokens": sampling_max_tokens,
        "max_model_len": max_model_len,
        "timeout_s": {"setup": t.setup, "rollout": t.rollout, "finalize": t.finalize, "scoring": t.scoring},
        "scoring_s_max": round(max(scoring_times), 4) if scoring_times else None,
    }
    fails, warns = [], []
    values = [env.max_turns, env.max_total_tokens, t.setup, t.rollout, t.finalize, t.scoring]
    if any(v is None or not math.isfinite(v) for v in values):
        fails.append("a turn, token or time limit is unset or infinite")
    if env.max_turns < need_turns:
        fails.append(f"max_turns {env.max_turns} < the {need_turns} turns a reference solution needs")
    if scoring_times and max(scoring_times) > 0.5 * t.scoring:
        fails.append(f"scoring took {max(scoring_times):.2f} s, over half the {t.scoring} s scoring timeout")
    if max_model_len is not None and env.max_total_tokens > max_model_len:
        warns.append(
            f"max_total_tokens {env.max_total_tokens} > inference max_model_len {max_model_len}: a long "
            "rollout would be rejected by the engine (ProviderError) instead of truncated"
        )
    if sampling_max_tokens is not None and sampling_max_tokens >= env.max_total_tokens:
        warns.append(f"max_completion_tokens {sampling_max_tokens} >= max_total_tokens {env.max_total_tokens}")
    if fails:
        return GateItem("bounded_limits", env.name, "FAIL", "; ".join(fails + warns), ev)
    if warns:
        return GateItem("bounded_limits", env.name, "WARN", "; ".join(warns), ev)
    return GateItem(
        "bounded_limits",
        env.name,
        "PASS",
        f"max_turns {env.max_turns}, max_total_tokens {env.max_total_tokens}, rollout timeout "
        f"{t.rollout} s; scoring well within its timeout",
        ev,
    )


def validate_config(
    cfg: RLConfig, *, envs: Sequence[str] | None = None, n: int = 20, success_min: float = 1.0, failure_max: float = 0.0
) -> Verdict:
    """Run the model-free gate on every selected env of ``cfg`` (an ``RLConfig``); returns the Verdict.

    ``n``: tasks checked per env (the first n after ``select``); ``success_min``: the reward a reference solution
    must reach; ``failure_max``: the most an empty reply may score. Raises ValueError for an unknown env name.
    """
    from toolkit.orchestrator.producer import env_list, env_sampling

    selected = env_list(cfg, envs)
    max_model_len = cfg.inference.vllm.get("max_model_len")
    verdict = Verdict(
        "validate",
        settings={
            "envs": [e.name for e, _ in selected],
            "n": n,
            "success_min": success_min,
            "failure_max": failure_max,
        },
    )
    with workers_import_path(cfg):
        for env, kind in selected:
            max_tokens = env_sampling(cfg, env, kind).max_tokens
            verdict.items.extend(
                asyncio.run(
                    _validate_env_async(
                        env,
                        n=n,
                        success_min=success_min,
                        failure_max=failure_max,
                        max_model_len=int(max_model_len) if max_model_len else None,
                        sampling_max_tokens=max_tokens,
                        kind=kind,
                    )
                )
            )
    return verdict


@contextlib.contextmanager
def workers_import_path(cfg: RLConfig) -> Iterator[None]:
    """The env workers' import path while the block runs: ``cfg.env_pythonpath()`` (the orchestrator's
    ``env_vars.PYTHONPATH``, else the run's) in front of ``sys.path`` and of ``os.environ["PYTHONPATH"]``; both
    restored afterwards."""
    entries = cfg.env_pythonpath()
    saved_path, saved_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path[:0] = [p for p in entries if p not in sys.path]
    if entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([*entries, *([saved_env] if saved_env else [])])
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_env
