"""Reports tell the truth about evals and rollouts: scores with their standard errors on their own axis, only
scores ranked as best, sample rollouts as text, truncation flagged, the config folded, sweeps compared on the score,
and an SFT -> RL chain's evals on one time line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from analysis_runs import make_run

from analysis import samples as samples_mod
from analysis.figures import eval_scores, fig_eval
from analysis.loaders import load_metrics, load_run
from analysis.report import _chain_before, build_report, outcome_rows, sweep_table
from toolkit.fsutil import append_jsonl, atomic_write_json
from toolkit.run.layout import RunDir, point_symlink
from toolkit.run.store import RolloutStoreWriter, load_rollouts, load_samples
from toolkit.run.types import Rollout, TrainingSample

BOOKKEEPING = {"eval/policy_version": 7.0, "eval/arith-test/examples": 64.0, "eval/arith-test/errored": 3.0}


def _with_eval_extras(run: RunDir, steps: list[int]) -> None:
    """What the orchestrator records beside each eval's scores: standard errors and the eval's bookkeeping, whose
    values (64 examples, version 7) are larger than any score and so would be ranked 'best' if taken for one."""
    for s in steps:
        append_jsonl(
            run.metrics,
            {
                "step": s,
                "time": 1.0,
                "role": "orchestrator",
                **BOOKKEEPING,
                "eval/arith-test/avg@2/stderr": 0.01 + 0.001 * s,
                "eval/arith-test/pass@2/stderr": 0.02,
            },
        )


def test_outcome_ranks_only_scores_and_gives_their_stderr(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=7)
    _with_eval_extras(run, [0, 3, 6])
    rows = dict(outcome_rows(load_run(run.root)))
    ranked = [k for k in rows if "first -> best -> last" in k]
    assert ranked == ["eval/arith-test/avg@2 first -> best -> last", "eval/arith-test/pass@2 first -> best -> last"]
    assert "± 0.01 (step 0) ->" in rows[ranked[0]] and "± 0.016 (step 6)" in rows[ranked[0]]
    assert eval_scores(load_metrics(run)) == ["eval/arith-test/avg@2", "eval/arith-test/pass@2"]


def test_eval_figure_draws_scores_with_error_bars_only(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=7)
    _with_eval_extras(run, [0, 3, 6])
    fig = fig_eval(None, load_metrics(run))
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["eval/arith-test/avg@2", "eval/arith-test/pass@2"]
    assert len(ax.containers) == 2 and all(c.has_yerr for c in ax.containers)
    bars = ax.containers[0].lines[2][0].get_segments()  # the vertical error bar of each point
    assert [round(seg[1][1] - seg[0][1], 4) for seg in bars] == [0.02, 0.026, 0.032]  # 2 x stderr: +/- 1
    assert ax.get_ylim()[1] < 2  # bookkeeping (64 examples, version 7) is not on the score axis


def test_chain_puts_the_sft_evals_first_on_one_time_line(tmp_path: Path) -> None:
    sft = make_run(tmp_path / "sft", steps=7)
    rl = make_run(tmp_path / "rl", steps=4)
    cfg = json.loads(rl.resolved("rl").read_text())
    cfg["model"]["name"] = str(sft.root)
    atomic_write_json(rl.resolved("rl"), cfg)
    before = _chain_before(load_run(rl.root))
    assert before is not None and before[0] == "run sft"
    fig = fig_eval(None, load_metrics(rl), before=before)
    (ax,) = fig.axes
    xs = [list(line.get_xdata()) for line in ax.get_lines() if len(line.get_xdata()) > 1]
    assert [0, 3, 6] in xs and [6, 9] in xs  # the RL run's steps 0 and 3 follow the SFT run's last step 6
    assert _chain_before(load_run(sft.root)) is None  # its model is no run directory
    cfg["model"]["name"] = str(sft.root / "model")  # the SFT run's exported model names the same run
    atomic_write_json(rl.resolved("rl"), cfg)
    assert _chain_before(load_run(rl.root))[0] == "run sft"


def _char_tokenizer(model_dir: Path) -> dict[str, int]:
    """A real ``tokenizer.json`` (character level) in ``model_dir``, as a model directory holds one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz :R<>|")}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="|"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    model_dir.mkdir(parents=True)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "config.json").write_text("{}")
    return vocab


def _rollout(
    vocab: dict[str, int], text: str, reply: str, reward: float, *, truncated: bool = False, gid: int = 0
) -> Rollout:
    ids = [vocab[c] for c in reply]
    return Rollout(
        env="rev",
        task_id=text,
        example_id=gid,
        reward=reward,
        truncated=truncated,
        truncation_reason="max_tokens" if truncated else None,
        group_id=gid,
        num_turns=1,
        samples=[TrainingSample([vocab[c] for c in f"Reverse: {text}"], ids, [True] * len(ids), [0.0] * len(ids))],
    )


def test_report_shows_sample_rollouts_as_text_and_flags_truncation(tmp_path: Path) -> None:
    vocab = _char_tokenizer(tmp_path / "model")
    run = RunDir(tmp_path / "run")
    run.config_attempt(1).joinpath("resolved").mkdir(parents=True)
    point_symlink(run.latest_configs, "attempt_1")
    atomic_write_json(run.resolved("rl", attempt=1), {"model": {"name": str(tmp_path / "model")}, "max_steps": 2})
    with RolloutStoreWriter(run.rollout_store) as w:
        w.append([_rollout(vocab, "abc", "zz", 0.1, truncated=True)] * 4, step=1)
        w.append(
            [_rollout(vocab, "abc", "cba", 1.0, gid=1), _rollout(vocab, "abcd", "dxxxxxxx", 0.2, gid=2, truncated=True)]
            + [_rollout(vocab, "xyz", "zyxxxxx", 0.5, truncated=True, gid=3)] * 8,
            step=2,
        )
    picks = samples_mod.pick_samples(load_rollouts(run.rollout_store))
    assert list(picks["which"]) == ["best", "worst", "truncated"] and set(picks["step"]) == {2}
    rows = load_samples(run.rollout_store, picks["row"].tolist())
    assert [len(rows[r]) for r in picks["row"]] == [1, 1, 1]

    paths = build_report([run.root], tmp_path / "out", run_figures=False)
    md = paths.markdown.read_text()
    shown = pd.read_csv(paths.tables["samples"])
    assert list(shown["completion"]) == ["cba", "dxxxxxxx", "dxxxxxxx"]
    assert list(shown["prompt"]) == ["Reverse: abc", "Reverse: abcd", "Reverse: abcd"]
    assert "#### Sample rollouts" in md
    outcome = md[md.index("### Outcome") : md.index("### 1.")]
    assert "truncated rollouts (train rev)" in outcome
    assert "TRUNCATED: rewards are of cut-off replies" in outcome and "90.0% at step 2" in outcome
    assert "92.9% of 14 over the run, limit max_tokens" in outcome
    # The resolved config sits behind a fold in both twins.
    assert "<details><summary>resolved rl.json</summary>" in md
    assert "<details><summary>resolved rl.json</summary><pre>" in paths.html.read_text()


def test_samples_without_a_tokenizer_show_token_ids(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=2)  # model "tiny-test-model": no such directory
    picks = samples_mod.pick_samples(load_rollouts(run.rollout_store))
    shown = samples_mod.sample_texts(run.rollout_store, picks, "tiny-test-model")
    assert set(picks["env"]) == {"arith", "reverse-text", "arith-test"}
    assert shown["completion"].str.startswith("token ids: ").all()


def test_sweep_compares_scores_not_bookkeeping(tmp_path: Path) -> None:
    roots = []
    for i, lr in enumerate([1, 2]):
        run = make_run(tmp_path / f"r{i}", steps=4, seed=i, meta={"sweep_point": {"lr": lr, "seed": i}})
        _with_eval_extras(run, [0, 3])
        roots.append(run.root)
    table, _ = sweep_table([load_run(r) for r in roots])
    assert set(table["metric"]) == {"reward/all/mean", "eval/arith-test/avg@2", "eval/arith-test/pass@2"}
    paths = build_report(roots, tmp_path / "out", run_figures=False)
    assert list(paths.figures) == [
        "sweep_eval_arith-test_avg_2",
        "sweep_eval_arith-test_pass_2",
        "sweep_reward_all_mean",
    ]


def _orchestrator_line(run: RunDir, step: int, metrics: dict[str, float]) -> None:
    append_jsonl(run.metrics, {"step": step, "time": 1.0, "role": "orchestrator", **metrics})


def test_a_distilling_run_gets_the_distillation_figure_and_others_do_not(tmp_path: Path) -> None:
    from analysis.figures import fig_distillation

    run = make_run(tmp_path / "run", steps=3)
    assert fig_distillation(None, load_metrics(run)) is None  # no teacher: no figure
    for s in (1, 2, 3):
        _orchestrator_line(
            run, s, {"reward/opd/mean": 0.1 * s, "teacher/opd/kl": 1.0 / s, "teacher/opd/latency_s": 0.05}
        )
        append_jsonl(run.metrics, {"step": s, "time": 1.0, "role": "trainer", "ref_kl/mean": 0.9 / s})
    fig = fig_distillation(None, load_metrics(run))
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert {"teacher/opd/kl", "ref_kl/mean (trainer)", "reward/opd/mean", "teacher/opd/latency_s"} <= set(labels)


def test_an_elastic_run_gets_the_replicas_figure_and_others_do_not(tmp_path: Path) -> None:
    from analysis.figures import fig_inference_replicas

    run = make_run(tmp_path / "run", steps=3)
    assert fig_inference_replicas(None, load_metrics(run)) is None  # no elastic replicas: no figure
    for s, replicas, retried, lost in ((4, 0, 0, 0), (5, 1, 0, 0), (6, 0, 3, 2)):
        append_jsonl(
            run.metrics,
            {
                "step": s,
                "time": 1.0,
                "role": "orchestrator",
                "reward/all/mean": 0.1 * s,
                "effective_batch_size": 32,
                "time/step": 0.5,
                "inference/replicas": replicas,
                "inference/retried_requests": retried,
                "inference/lost_requests": lost,
            },
        )
    fig = fig_inference_replicas(None, load_metrics(run))
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert {"inference/replicas", "reward", "rollouts/s", "retried requests"} <= set(labels)
    lost = next(line for ax in fig.axes for line in ax.get_lines() if line.get_label().startswith("requests held"))
    assert list(lost.get_ydata())[-3:] == [0.0, 0.0, 2.0]  # per step, from the running count


def test_the_reward_figure_draws_each_seat_of_a_multi_seat_env(tmp_path: Path) -> None:
    from analysis.figures import fig_reward
    from analysis.summary import step_summary

    run = make_run(tmp_path / "run", steps=3)
    data = load_run(run)
    steps = step_summary(data.rollouts)
    solo = [line.get_label() for ax in fig_reward(steps, data.metrics).axes for line in ax.get_lines()]
    assert not [x for x in solo if "seat" in x]  # no multi-seat env: no seat lines
    for s in (1, 2, 3):
        seats = {"reward/game/seat/left/mean": 0.2 * s, "reward/game/seat/right/mean": 1 - 0.2 * s}
        _orchestrator_line(run, s, {"reward/game/mean": 0.5, **seats})
    data = load_run(run)
    fig = fig_reward(steps, data.metrics)
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    assert list(lines["game, seat left"].get_ydata()) == pytest.approx([0.2, 0.4, 0.6])
    assert list(lines["game, seat right"].get_ydata()) == pytest.approx([0.8, 0.6, 0.4])
