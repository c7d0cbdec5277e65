"""Every refusal the job's roles raise on their config is refused by the dry run first, or this table says why the
login node cannot know it.

:data:`REFUSALS` lists, per module of the orchestrator, trainer and env workers that reads the run config, each
``raise`` of an error (found by a piece of its text). A new ``raise`` in those modules fails
:func:`test_every_raise_in_the_config_reading_modules_is_listed` until it is listed here, with the config that
triggers it and the text the login node's refusal must hold, or with the reason it cannot be checked there.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from config_cases import config, errors_of

from toolkit.envs.tasksets import BUILTIN_TASKSETS

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = min(BUILTIN_TASKSETS)


def _train(**taskset) -> dict:
    return {"orchestrator": {"train": {"env": [{"taskset": {"id": BUILTIN, **taskset}}]}}}


def _eval(**env) -> dict:
    return {"orchestrator": {"eval": {"env": [{"taskset": {"id": BUILTIN, "split": "test"}, **env}]}}}


# (module, text of the raise, config patch or None, login-node refusal text or why it cannot be checked there)
REFUSALS: list[tuple[str, str, dict | None, str]] = [
    ("toolkit/envs/registry.py", "resolves nowhere", _train(id="zz-resolves-nowhere"), "unknown taskset"),
    (
        "toolkit/envs/registry.py",
        "must export exactly one Taskset subclass",
        None,
        "only srl's own built-in modules reach it; tests/unit/test_envs_registry.py loads each of them",
    ),
    ("toolkit/envs/registry.py", "{who}taskset '{tid}' has no field", "NO_SPLIT_FIELD", "has no field 'split'"),
    ("toolkit/envs/registry.py", "rejects its fields", _train(no_such_field=1), "rejects its fields"),
    (
        "toolkit/envs/registry.py",
        "an eval env would load the taskset's train rows",
        {"orchestrator": {"eval": {"env": [{"taskset": {"id": BUILTIN, "split": "train"}}]}}},
        "eval env would load the taskset's train rows",
    ),
    (
        "toolkit/envs/registry.py",
        "is infinite: bound it with select.limit",
        None,
        "whether a taskset is finite is known once it is built, which reads its data",
    ),
    (
        "toolkit/envs/fidelity.py",
        "harness.runtime: {problem}",
        _eval(harness={"runtime": {"type": "modal"}}),
        "remote sandbox",
    ),
    (
        "toolkit/envs/fidelity.py",
        "does not fit verifiers'",
        _eval(harness={"runtime": {"type": "subprocess", "no_such_runtime_field": 1}}),
        "does not fit verifiers'",
    ),
    (
        "toolkit/envs/fidelity.py",
        'raise EnvFeatureError("\\n".join(listed))',
        _eval(harness={"id": "tool-agent"}),
        "harness 'tool-agent' not found",
    ),  # a harness verifiers cannot load; the pairings need the tasks (data)
    (
        "toolkit/envs/traces.py",
        "is infinite: bound it with select.limit",
        None,
        "whether a taskset is finite is known once it is built, which reads its data",
    ),
    (
        "toolkit/envs/traces.py",
        "spec has no policy.model_path",
        None,
        "the orchestrator writes the worker's spec with the policy's model; no config value reaches it",
    ),
    (
        "toolkit/orchestrator/main.py",
        "one batch holds samples drawn with different temperature",
        {"orchestrator": {"train": {"env": [{"taskset": {"id": BUILTIN}, "sampling": {"temperature": 0.5}}]}}},
        "a train env samples with orchestrator.train.sampling's temperature",
    ),
    (
        "toolkit/orchestrator/main.py",
        "orchestrator.train.env is empty",
        {"orchestrator": {"train": {"env": []}}},
        "orchestrator.train.env",
    ),
    (
        "toolkit/orchestrator/sampler.py",
        "EnvSampler needs at least one env",
        {"orchestrator": {"train": {"env": []}}},
        "orchestrator.train.env",
    ),
    (
        "toolkit/orchestrator/sampler.py",
        "has no examples to sample",
        None,
        "how many tasks select leaves is known once the taskset's tasks are loaded (its data)",
    ),
    (
        "toolkit/orchestrator/sampler.py",
        "env ratios must be > 0",
        {"orchestrator": {"train": {"env": [{"taskset": {"id": BUILTIN}, "ratio": 0}]}}},
        "ratio",
    ),
    (
        "toolkit/orchestrator/sampler.py",
        "sampler state was saved with seed",
        None,
        "compares the config with the sampler state a checkpoint of this run holds, written by the job itself",
    ),
    (
        "toolkit/orchestrator/producer.py",
        "no env named",
        None,
        "names come from srl eval's --env argument, not the config; srl eval checks them before anything starts",
    ),
    (
        "toolkit/orchestrator/advantages.py",
        "needs one completion length per reward",
        None,
        "an invariant of the orchestrator's own batches, not a config value",
    ),
    (
        "toolkit/orchestrator/advantages.py",
        "needs max_completion_tokens >= 1",
        {"orchestrator": {"train": {"sampling": {"max_completion_tokens": 0}}}},
        "max_completion_tokens",
    ),
    (
        "toolkit/orchestrator/advantages.py",
        "unknown advantage algo",
        {"orchestrator": {"algo": {"type": "nope"}}},
        "algo",
    ),
    ("toolkit/trainer/optim.py", "unknown scheduler type", {"trainer": {"scheduler": {"type": "nope"}}}, "scheduler"),
    (
        "toolkit/trainer/optim.py",
        "needs total_steps",
        None,
        "the trainer passes max_steps, which the schema requires: never unset in a job",
    ),
    ("toolkit/trainer/model.py", "unknown dtype", {"model": {"dtype": "float8"}}, "dtype"),
    (
        "toolkit/trainer/packing.py",
        "tokens > trainer.seq_len",
        None,
        "a rollout's length is known once it is generated; the dry run warns when the token limits allow it",
    ),
    ("toolkit/trainer/packing.py", "bad packing sizes", None, "an invariant of the trainer's own arguments"),
]

# The error classes a bad config value raises (a stop request or a timeout is no refusal of the config).
_RAISE_RE = re.compile(
    r"^\s*raise\s+(ValueError|TypeError|KeyError|ModuleNotFoundError|TasksetFieldError|"
    r"EnvFeatureError)\("
)


def _raise_statements(module: str) -> list[str]:
    """Each ``raise`` of a config error in ``module``, with the lines that continue its call (the message)."""
    lines = (ROOT / module).read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if _RAISE_RE.match(line):
            out.append("\n".join(lines[i : i + 4]))
    return out


def test_every_raise_in_the_config_reading_modules_is_listed():
    for module in sorted({m for m, *_ in REFUSALS}):
        texts = [t for m, t, *_ in REFUSALS if m == module]
        for statement in _raise_statements(module):
            assert any(t in statement for t in texts), (
                f"{module}: a job-side refusal that is not in REFUSALS (add it, with the config that triggers it "
                f"and the dry run's refusal, or why the login node cannot know it):\n{statement}"
            )
        for t in texts:
            assert any(t in s for s in _raise_statements(module)), f"{module} no longer raises {t!r}: update REFUSALS"


NO_SPLIT = textwrap.dedent("""
    import verifiers.v1 as vf

    class OwnConfig(vf.TasksetConfig):
        dataset_split: str = "train"

    class OwnTaskset(vf.Taskset[vf.Task, OwnConfig]):
        def load(self):
            raise RuntimeError("data loaded on the login node")

    __all__ = ["OwnTaskset"]
""")


@pytest.mark.parametrize("case", [r for r in REFUSALS if r[2] is not None], ids=lambda r: f"{r[0]}: {r[1][:40]}")
def test_the_dry_run_refuses_the_same_input_first(case, tmp_path):
    _, _, patch, refusal = case
    if patch == "NO_SPLIT_FIELD":
        (tmp_path / "no_split_task.py").write_text(NO_SPLIT)
        patch = {
            "env_vars": {"PYTHONPATH": str(tmp_path)},
            "orchestrator": {"eval": {"env": [{"taskset": {"id": "no-split-task", "split": "test"}}]}},
        }
    assert refusal in errors_of(config(patch))


def test_what_cannot_be_checked_says_why():
    for module, text, patch, why in REFUSALS:
        if patch is None:
            assert len(why) > 30, f"{module}: {text!r} needs the reason the login node cannot check it"
