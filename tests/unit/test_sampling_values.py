"""Sampling values either are refused at load, naming the field, or train with a finite loss.

Each hypothesis draw of train sampling (temperature, top_p, top_k, min_p) goes through the config load an
``srl rl`` does. A refused draw must name a field whose value is outside what can train; an accepted one must have
none, and a batch sampled from the tiny model with exactly those values (the engine's processing: logits divided
by the temperature, then top-k and top-p truncation, logprobs of that processed distribution) must give the
trainer a finite loss and gradient.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from config_cases import validate
from golden.layouts import BASE, merge
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toolkit.batches import samples_to_batch, sampling_meta
from toolkit.config import ConfigError
from toolkit.config.rules import MIN_TRAIN_TEMPERATURE
from toolkit.models.tiny import build_tiny_model
from toolkit.run.types import SamplingParams, TrainingSample
from toolkit.trainer.loss import IPOLoss
from toolkit.trainer.model import load_policy
from toolkit.trainer.packing import plan_micro_batches
from toolkit.trainer.step import train_step

_MISSING = object()  # min_p left out of the table


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_policy(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


def _culprits(t: float, top_p: float, top_k: int | None, min_p: object) -> set[str]:
    """Fields of a draw that cannot train (what the config must refuse)."""
    bad = set()
    if math.isnan(t) or not MIN_TRAIN_TEMPERATURE <= t <= 10.0:
        bad.add("temperature")
    if math.isnan(top_p) or not 0.0 < top_p <= 1.0:
        bad.add("top_p")
    if top_k is not None and not 0 <= top_k <= 512:
        bad.add("top_k")
    elif "top_p" not in bad and (top_p < 1.0 or top_k) and not (top_k and 0 < top_k <= 512):
        bad.add("top_k")  # truncated sampling needs a bounded top_k (its logprobs stay well defined)
    if min_p is not _MISSING:
        bad.add("min_p")  # srl has no min_p: an unknown field
    return bad


def _engine_like_batch(model, *, temperature: float, top_p: float, top_k: int | None, seed: int):
    """4 samples of 6 tokens drawn from ``model`` as the engine draws them, with their processed logprobs; the
    batch records that sampling as the orchestrator does."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    samples = []
    for _ in range(4):
        prompt = torch.randint(4, vocab, (5,), generator=g).tolist()
        ids, lps = list(prompt), []
        for _ in range(6):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            if temperature < 1e-5:  # vLLM decodes greedily below this: the top token, with probability 1
                ids.append(int(logits.argmax()))
                lps.append(0.0)
                continue
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, vocab)).values[-1]
                logits = logits.masked_fill(logits < kth, -math.inf)
            if top_p < 1.0:
                probs = torch.softmax(logits, -1)
                order = torch.argsort(probs, descending=True)
                before = torch.cumsum(probs[order], 0) - probs[order]  # mass ranked above each token
                # The top token always stays, as in the engine: a top_p below float32's smallest value
                # (5e-324) compares as 0 and would otherwise drop every token.
                drop = order[1:][before[1:] >= top_p]
                logits[drop] = -math.inf
            logp = torch.log_softmax(logits, -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=g))
            ids.append(tok)
            lps.append(float(logp[tok]))
        samples.append(TrainingSample(prompt, ids[len(prompt) :], [True] * 6, lps))
    meta = {"sampling": sampling_meta(SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k))}
    return samples_to_batch(1, samples, [1.0, -1.0, 0.5, -0.5], policy_versions=[0] * 4, envs=["e"] * 4, meta=meta)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    temperature=st.one_of(
        st.sampled_from([0.0, 1e-6, 0.009, MIN_TRAIN_TEMPERATURE, 10.0, 10.5, -1.0, math.nan]), st.floats(0.0, 12.0)
    ),
    top_p=st.one_of(st.just(1.0), st.sampled_from([0.0, 1e-9, 0.5, 1.01, -0.1]), st.floats(0.0, 1.2)),
    top_k=st.one_of(st.none(), st.sampled_from([0, 1, 512, 513, -1]), st.integers(-3, 600)),
    min_p=st.one_of(st.just(_MISSING), st.just(_MISSING), st.floats(0.0, 1.0)),
    seed=st.integers(0, 2**16),
)
# Draws that must be decided every run, whatever hypothesis picks: greedy and near-greedy temperatures with
# otherwise plain sampling, the bounds themselves, and truncation with and without a top_k.
@example(temperature=0.0, top_p=1.0, top_k=None, min_p=_MISSING, seed=0)
@example(temperature=1e-6, top_p=1.0, top_k=None, min_p=_MISSING, seed=0)
@example(temperature=MIN_TRAIN_TEMPERATURE, top_p=1.0, top_k=None, min_p=_MISSING, seed=0)
@example(temperature=10.0, top_p=1e-9, top_k=1, min_p=_MISSING, seed=1)
@example(temperature=0.7, top_p=0.5, top_k=None, min_p=_MISSING, seed=2)
@example(temperature=1.0, top_p=0.9, top_k=512, min_p=0.05, seed=3)
def test_each_sampling_draw_is_refused_naming_its_field_or_trains_with_finite_loss(
    tiny, temperature, top_p, top_k, min_p, seed
):
    table = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    if min_p is not _MISSING:
        table["min_p"] = min_p
    bad = _culprits(temperature, top_p, top_k, min_p)
    try:
        cfg = validate(merge(BASE, {"orchestrator": {"train": {"sampling": table}}})).config
    except ConfigError as e:
        assert bad, f"refused a draw that can train: {table}\n{e}"
        assert any(f"orchestrator.train.sampling.{f}" in str(e) for f in bad), (bad, str(e))
        return
    s = cfg.orchestrator.train.sampling
    batch = _engine_like_batch(tiny, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=seed)
    model = copy.deepcopy(tiny)
    m = train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        None,
        plan_micro_batches(batch, seq_len=64, micro_batch_size=4),
        loss_cfg=IPOLoss(),
        max_norm=1.0,
        num_samples=batch.num_samples,
        apply_update=False,
    )
    assert math.isfinite(m["loss/mean"]) and math.isfinite(m["optim/grad_norm"]), (table, m)
    # Same weights on both sides: the trainer's logprobs are the sampler's (temperature, top-k and top-p applied).
    assert m["mismatch_kl/mean"] < 1e-4, (table, m)
    assert m["optim/skipped_update"] == 0, (table, m)
    assert not bad, f"accepted {table}, whose {sorted(bad)} should have been refused"


def test_temperature_zero_is_refused_with_the_reason_and_the_eval_may_use_it():
    over = {"orchestrator": {"train": {"sampling": {"temperature": 0}}}}
    with pytest.raises(
        ConfigError,
        match=r"orchestrator\.train\.sampling\.temperature: train sampling needs "
        r"temperature >= 0\.01 \(got 0\)",
    ):
        validate(merge(BASE, over))
    env = {"taskset": {"id": "srl-reverse-text"}, "sampling": {"temperature": 0.0}}
    with pytest.raises(ConfigError, match=r"orchestrator\.train\.env\[0\]\.sampling\.temperature"):
        validate(merge(BASE, {"orchestrator": {"train": {"env": [env]}}}))
    greedy_eval = {
        "orchestrator": {
            "eval": {
                "sampling": {"temperature": 0.0},
                "env": [{"taskset": {"id": "srl-reverse-text", "split": "test"}}],
            }
        }
    }
    assert validate(merge(BASE, greedy_eval)).config.orchestrator.eval.sampling.temperature == 0.0


def test_trainer_scores_tokens_under_the_temperature_and_truncation_the_batch_records(tiny):
    """Trainer vs sampler logprobs at temperature 0.7, top_p 0.8, top_k 20 on the same weights: the trainer takes
    the sampling from the batch (what the orchestrator records) and its mismatch KL is ~0. The same tokens scored
    as if drawn at temperature 1 without truncation (the record dropped) disagree: the check has teeth."""
    batch = _engine_like_batch(tiny, temperature=0.7, top_p=0.8, top_k=20, seed=5)
    assert batch.sampling == SamplingParams(temperature=0.7, top_p=0.8, top_k=20)

    def kl(b):
        model = copy.deepcopy(tiny)
        m = train_step(
            model,
            torch.optim.SGD(model.parameters(), lr=0.0),
            None,
            plan_micro_batches(b, seq_len=64, micro_batch_size=4),
            loss_cfg=IPOLoss(),
            max_norm=1.0,
            num_samples=b.num_samples,
            apply_update=False,
        )
        return m["mismatch_kl/mean"]

    assert kl(batch) < 1e-5
    batch.meta.pop("sampling")
    assert kl(batch) > 1e-2
