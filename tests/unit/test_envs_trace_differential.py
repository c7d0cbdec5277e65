"""Differential: environments srl runs through verifiers' own rollout (``TraceEnv``, as an env worker runs them) give
what verifiers' own eval gives them, episode by episode, with one script answering both: verifiers' eval client
over the loopback, and srl's policy, which reads only its prompt ids.

Compared per episode: every trace's seat and standing, reward, reward components, metrics, stop condition,
truncation, turns, errors, rollout state and message graph (nodes with their parents, and ``Trace.branches``); the
error class srl raises for a failed episode; and what srl hands the trainer: one rollout per trainable trace whose
fields are the trace's, whose samples are exactly the trace's trainable ``Trace.branches`` (prompt ids before the
first sampled token, then the rest with the sampled mask and logprobs), whose policy version is the oldest that
sampled them, and whose tokens are the very prompt + completion ids the policy saw on that branch.

The corpus (tests/fixtures/vf_envs) covers what srl's plain chat loop cannot play: a harness that compacts its
context (two branches), two trainable seats, Env classes with setup/finalize and an untrainable seat, a simulated
user, ``@vf.intercept`` and ``@vf.stop`` hooks on requests and responses, and a shared tool server whose state is
each rollout's own.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.vf_differential import (
    FIXTURES,
    Conversation,
    ScriptedPolicy,
    ScriptedServer,
    fixtures_on_path,
    run_env_srl,
    run_env_verifiers,
    tool_call_text,
)

fixtures_on_path()

VF_TO_SRL_ERROR = {"EnvError": "TaskError", "InterceptionError": "HarnessError"}
"""verifiers error types srl reports under another class name (any other keeps its name)."""

LIMIT_STOPS = {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}


# ------------------------------------------------------------------------------------------------------------
# Scripts: the model's replies, a function of the conversation it is shown
# ------------------------------------------------------------------------------------------------------------
def _last(conversation: Conversation) -> str:
    return conversation[-1][1]


def compact_script(conversation: Conversation) -> str:
    """Compute with bash; summarize the tool result when asked to checkpoint; answer from the summary."""
    role, last = conversation[-1]
    if role == "user" and "CONTEXT CHECKPOINT COMPACTION" in last:
        result = [text for r, text in conversation if r == "tool"][-1]
        return f"Bash printed {result.strip()}; reply with it."
    if role == "user" and "summary produced by the other language model" in last:
        return re.findall(r"\d+", last.split("language model:")[-1])[0]
    a, b = re.search(r"What is (\d+) times (\d+)", last).groups()
    return tool_call_text("bash", {"command": f"echo $(({a}*{b}))"})


def count_script(conversation: Conversation) -> str:
    """The next number, except that Right miscounts from 12 on."""
    n = int(re.search(r"The count is (-?\d+)", _last(conversation)).group(1))
    return str(n + 2 if "Right" in conversation[0][1] and n >= 12 else n + 1)


def review_script(conversation: Conversation) -> str:
    """The solver adds (wrongly from 5 on); the reviewer approves exactly the right sums."""
    last = _last(conversation)
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)", last).groups())
    if "Proposed answer" in last:
        return "APPROVE" if re.search(r"Proposed answer: (\S*)", last).group(1) == str(a + b) else "REJECT"
    return str(a + b if a < 5 else a + b + 1)


def yes_script(conversation: Conversation) -> str:
    return "yes"


def guess_script(conversation: Conversation) -> str:
    """Bisect 1..8 on the user's hints."""
    low, high = 1, 8
    guesses = [int(text) for role, text in conversation if role == "assistant"]
    hints = [text for role, text in conversation if role == "user"][1:]
    for guess, hint in zip(guesses, hints, strict=False):
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    return str((low + high) // 2)


def hooked_script(conversation: Conversation) -> str:
    """Echo the prompt plus a second line (which the response hook cuts); refuse the launch code."""
    last = _last(conversation)
    return "I refuse to share it." if "launch code" in last else f"{last}\nThat is all."


def tally_script(conversation: Conversation) -> str:
    """One tally call per listed item, then the tool's last count."""
    prompt = next(text for role, text in conversation if role == "user")
    items = [item.strip() for item in prompt.split("Items:")[1].split(",")]
    results = [text for role, text in conversation if role == "tool"]
    if len(results) < len(items):
        return tool_call_text("tally_add", {"item": items[len(results)]})
    return results[-1].strip()


# ------------------------------------------------------------------------------------------------------------
# The corpus
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One environment of the corpus: its taskset id and fields, the tasks run (by position), the script, the
    harness each side runs (``harness``: verifiers' seats, None for the seat's own or the taskset's bundled one;
    ``srl_harness``: srl's ``harness.id``), and ``exercised``: that verifiers' episodes really show the feature."""

    taskset_id: str
    script: Callable[[Conversation], str]
    tasks: list[int]
    harness: str | None
    srl_harness: str
    exercised: Callable[[list[Any]], bool]
    fields: dict[str, Any] = field(default_factory=dict)
    concurrent: bool = False
    max_turns: int = 8


CHAT = {"harness": "scripted_chat", "srl_harness": "scripted_chat"}
"""Both sides on the in-process chat harness (one request per segment; no tools)."""

CORPUS = {
    # A harness that compacts: the pre-compaction context and the compacted one are two branches of one trace.
    "compaction": Case(
        taskset_id="compact-notes",
        script=compact_script,
        tasks=[0],
        harness=None,
        srl_harness="default",
        exercised=lambda eps: [t.num_branches for t in eps[0].traces] == [2] and eps[0].traces[0].reward == 1.0,
    ),
    # Two trainable seats of one episode, relayed by the env; a rival's record crosses over in finalize().
    "two-seats": Case(
        taskset_id="count-relay",
        script=count_script,
        tasks=[0, 1],
        **CHAT,
        exercised=lambda eps: (
            [[(t.agent.name, t.agent.trainable) for t in e.traces] for e in eps]
            == [[("right", True), ("left", True)]] * 2
            and [t.reward for t in eps[1].traces] == [0.5, 1.0]
        ),
    ),
    # The seats' turn limit ends the game early: a truncated trace (verifiers' max_turns stop) next to a closed one.
    "two-seats-turn-limit": Case(
        taskset_id="count-relay",
        script=count_script,
        tasks=[0],
        **CHAT,
        exercised=lambda eps: (
            [(t.stop_condition, t.is_truncated) for t in eps[0].traces] == [("user_closed", False), ("max_turns", True)]
        ),
        max_turns=1,
    ),
    # The taskset's own Env: setup() benches a seat (untrainable), finalize() adds its verdict to the solver.
    "env-class": Case(
        taskset_id="review-desk",
        script=review_script,
        tasks=[0, 1],
        **CHAT,
        exercised=lambda eps: (
            [t.agent.trainable for e in eps for t in e.traces] == [True, False] * 2
            and [e.traces[0].reward for e in eps] == [1.5, 0.0]
        ),
    ),
    # The taskset's own Env running one seat twice per episode.
    "env-class-two-attempts": Case(
        taskset_id="best-of-two",
        script=yes_script,
        tasks=[0, 1],
        **CHAT,
        exercised=lambda eps: [[t.metrics["best_of_two"] for t in e.traces] for e in eps] == [[1, 1], [0, 0]],
    ),
    # The taskset's own Env playing the user of a multi-turn interaction.
    "env-class-simulated-user": Case(
        taskset_id="guess-user",
        script=guess_script,
        tasks=[0, 1],
        **CHAT,
        exercised=lambda eps: [(t.num_turns, t.reward) for e in eps for t in e.traces] == [(3, 1.0), (2, 1.0)],
    ),
    # @vf.intercept on request and response, @vf.stop on request (before any model call) and on response.
    "hooks": Case(
        taskset_id="hooked-reply",
        script=hooked_script,
        tasks=[0, 1, 2],
        **CHAT,
        exercised=lambda eps: (
            [t.stop_condition for e in eps for t in e.traces] == ["agent_completed", "refused", "classified"]
            and [r.handler for r in eps[0].traces[0].request_rewrites] == ["fill_name"]
            and [r.handler for r in eps[0].traces[0].response_rewrites] == ["first_line"]
            and eps[0].traces[0].reward == 1.0
        ),
    ),
    # A hook that raises fails the rollout: the error class must agree.
    "hook-raises": Case(
        taskset_id="hooked-reply",
        script=hooked_script,
        tasks=[0],
        **CHAT,
        exercised=lambda eps: [e.type for t in eps[0].traces for e in t.errors] == ["TaskError"],
        fields={"flaw": "hook_raises"},
    ),
    # A taskset-scoped tool server, one process for concurrent rollouts, each call on its own rollout's state.
    "shared-tool-state": Case(
        taskset_id="tally-tools",
        script=tally_script,
        tasks=[0, 1],
        harness="offline_chat",
        srl_harness="default",
        exercised=lambda eps: (
            [t.state.items for e in eps for t in e.traces] == [["pen", "cup"], ["map", "key", "jar"]]
            and all(t.reward == 1.0 for e in eps for t in e.traces)
        ),
        concurrent=True,
    ),
}


# ------------------------------------------------------------------------------------------------------------
# What is compared
# ------------------------------------------------------------------------------------------------------------
def _message(message: Any) -> tuple:
    """A message without its ids (tool-call ids are each client's own)."""
    from verifiers.v1.types import content_text

    calls = [(c.name, json.loads(c.arguments)) for c in getattr(message, "tool_calls", None) or []]
    return (message.role, content_text(message.content) or "", calls)


def _branch_paths(trace: Any) -> list[tuple[bool, list[int]]]:
    index = {id(node): i for i, node in enumerate(trace.nodes)}
    return [(b.trainable, [index[id(n)] for n in b.nodes]) for b in trace.branches]


def trace_view(trace: Any) -> dict[str, Any]:
    """Everything of a finished trace the two rollouts must agree on."""
    return {
        "seat": (trace.agent.name, trace.agent.trainable),
        "reward": trace.reward,
        "rewards": {k: (r.score, r.weight) for k, r in trace.rewards.items() if r is not None},
        "metrics": dict(trace.metrics),
        "stop": trace.stop_condition,
        "ok": trace.ok,
        "truncated": trace.is_truncated,
        "turns": trace.num_turns,
        "errors": [e.type for e in trace.errors],
        "state": trace.state.model_dump(),
        "rewrites": ([r.handler for r in trace.request_rewrites], [r.handler for r in trace.response_rewrites]),
        "nodes": [
            (n.parent, _message(n.message), n.sampled, [(p.node, p.type) for p in n.semantic_parents])
            for n in trace.nodes
        ],
        "branches": _branch_paths(trace),
    }


def episode_view(episode: Any) -> dict[str, Any]:
    """An episode's verdict, errors and traces (:func:`trace_view`), in the order verifiers recorded them."""
    return {
        "ok": episode.ok,
        "errors": [e.type for e in episode.errors],
        "traces": [trace_view(t) for t in episode.traces],
    }


def expected_error(episode: Any) -> str | None:
    """The srl error class of a verifiers episode: a trainable trace's last error, else the episode's own."""
    trainable = [t for t in episode.traces if t.agent.trainable]
    failed = next((t for t in trainable if t.has_error and t.errors), None)
    vf_type = failed.errors[-1].type if failed else (episode.errors[-1].type if episode.errors else None)
    if vf_type is None:
        return None
    return VF_TO_SRL_ERROR.get(vf_type, vf_type)


def branch_samples(trace: Any) -> list[dict[str, Any]]:
    """A trace's trainable branches as training samples: the ids before the first sampled token are the prompt."""
    out = []
    for branch in trace.branches:
        ids, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
        if not branch.trainable or True not in mask:
            continue
        start = mask.index(True)
        out.append(
            {
                "prompt_ids": ids[:start],
                "completion_ids": ids[start:],
                "completion_mask": mask[start:],
                "completion_logprobs": logprobs[start:],
            }
        )
    return out


def policy_tokens_match(trace: Any, policy: ScriptedPolicy) -> list[int]:
    """Check the trace's tokens against what the policy saw: along every branch, the ids up to each sampled node
    are one turn's prompt + completion ids, with that turn's logprobs on its sampled tokens; and every turn the
    policy sampled for the trace is on a branch, except a turn whose reply a response hook replaced (verifiers
    commits the replacement without the sampled ids, so that turn trains nothing). Returns the versions of the
    turns found on trainable branches."""
    turns = {tuple(t.prompt_ids + t.completion_ids): t for t in policy.turns if t.session_id == trace.id}
    versions, found = [], set()
    for branch in trace.branches:
        ids: list[int] = []
        for node in branch.nodes:
            ids += node.token_ids
            if not node.sampled or not any(node.mask):
                continue
            turn = turns.get(tuple(ids))
            assert turn is not None, f"trace {trace.id}: branch {branch.index} holds ids no policy turn produced"
            assert node.logprobs == turn.logprobs and sum(node.mask) == len(turn.completion_ids)
            found.add(turn.version)
            if branch.trainable:
                versions.append(turn.version)
    assert len(turns) - len(found) == len(trace.response_rewrites), f"trace {trace.id}: turns missing from branches"
    return versions


def _truncation_reason(trace: Any) -> str | None:
    """None for a complete trace; the framework limit verifiers stopped it at; else the reply's token limit."""
    if not trace.is_truncated:
        return None
    return trace.stop_condition if trace.stop_condition in LIMIT_STOPS else "max_tokens"


def expected_rollouts(episode: Any, policy: ScriptedPolicy) -> list[dict[str, Any]]:
    """srl's rollout fields for each trainable trace of the (srl-run) episode. A rollout without samples has no
    policy version to check (None here, whatever srl reports)."""
    out = []
    for trace in (t for t in episode.traces if t.agent.trainable):
        versions = policy_tokens_match(trace, policy)
        out.append(
            {
                "seat": trace.agent.name,
                "reward": trace.reward,
                "components": {k: r.score * r.weight for k, r in trace.rewards.items() if r is not None},
                "metrics": {k: float(v) for k, v in trace.metrics.items()},
                "num_turns": trace.num_turns,
                "truncated": trace.is_truncated,
                "truncation_reason": _truncation_reason(trace),
                "samples": branch_samples(trace),
                "policy_version": min(versions) if versions else None,
            }
        )
    return out


SAMPLE_FIELDS = ("prompt_ids", "completion_ids", "completion_mask", "completion_logprobs")
ROLLOUT_FIELDS = ("seat", "reward", "components", "metrics", "num_turns", "truncated", "truncation_reason")


def rollout_view(rollout: dict[str, Any]) -> dict[str, Any]:
    """The fields of one rollout ``TraceEnv.run`` returned that :func:`expected_rollouts` predicts."""
    return {
        **{k: rollout[k] for k in ROLLOUT_FIELDS},
        "samples": [{k: s[k] for k in SAMPLE_FIELDS} for s in rollout["samples"]],
        "policy_version": rollout["policy_version"] if rollout["samples"] else None,
    }


# ------------------------------------------------------------------------------------------------------------
# The test
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def renderer():
    from toolkit.models import resolve_model
    from toolkit.models.renderer import HermesRenderer

    return HermesRenderer(resolve_model("tiny-qwen3"))


@pytest.fixture(autouse=True)
def _fixtures_for_subprocesses(monkeypatch):
    """Tool servers start as ``python -m <module>`` from the fixtures; the modules this test imports leave
    ``sys.modules`` afterwards."""
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if str(FIXTURES) in str(getattr(sys.modules.get(name), "__file__", "") or ""):
            del sys.modules[name]


@pytest.mark.parametrize("case", CORPUS.values(), ids=CORPUS.keys())
def test_trace_env_agrees_with_verifiers_rollout(case: Case, renderer):
    """The case's tasks through verifiers' own Env and through srl's TraceEnv agree (see the module docstring),
    and verifiers' side really shows the feature the case is there for."""
    policy = ScriptedPolicy(renderer, case.script)

    async def verifiers_side() -> list[Any]:
        async with ScriptedServer(case.script) as server:
            return await run_env_verifiers(
                server, case.taskset_id, case.fields, case.harness, case.max_turns, case.tasks, case.concurrent
            )

    async def both() -> tuple[list[Any], list[Any]]:
        # The two sides share nothing (servers, tool processes, policy), so they run side by side.
        srl_side = run_env_srl(
            policy, case.taskset_id, case.fields, case.srl_harness, case.max_turns, case.tasks, case.concurrent
        )
        theirs, ours = await asyncio.gather(verifiers_side(), srl_side)
        return theirs, ours

    theirs, ours = asyncio.run(both())
    assert case.exercised(theirs), [episode_view(e) for e in theirs]
    assert len(ours) == len(theirs) == len(case.tasks)
    for task, vf_episode, srl in zip(case.tasks, theirs, ours, strict=True):
        where = f"{case.taskset_id} task {task}"
        assert srl.episode is not None, f"{where}: srl ran no episode ({srl.error})"
        assert episode_view(srl.episode) == episode_view(vf_episode), where
        assert srl.error == expected_error(vf_episode), where
        if srl.error is None:
            assert [rollout_view(r) for r in srl.result["traces"]] == expected_rollouts(srl.episode, policy), where
