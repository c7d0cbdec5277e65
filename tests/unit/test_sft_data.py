"""SFT data: layouts, loss masks by role and by message, column renames, bad rows, order and packing."""

from __future__ import annotations

import numpy as np
import pytest
from sft_rows import tiny_renderer, write_jsonl

from toolkit.config.sft import ColumnsConfig, LossMaskConfig, load_sft_config
from toolkit.trainer.sft_data import (
    DataError,
    SFTData,
    check_dataset,
    load_conversations,
    step_rows,
    to_batch,
    tokenize,
)


@pytest.fixture(scope="module")
def renderer():
    return tiny_renderer()


_jsonl = write_jsonl


def _text(renderer, ids, mask) -> str:
    return renderer.decode([int(t) for t, m in zip(ids, mask, strict=True) if m])


def test_prompt_completion_trains_the_completion_and_its_end_of_turn_only(renderer, tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "Reverse: abc", "completion": "cba"}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    ids, mask = tokenize(renderer, conv, LossMaskConfig(), "x")
    # The ids are the whole conversation rendered at once, and the prompt is what RL sampling would send.
    full = renderer.render(conv.messages, add_generation_prompt=False)
    prompt = renderer.render(conv.messages[:1], add_generation_prompt=True)
    assert ids.tolist() == full
    assert not mask[: len(prompt)].any()
    assert _text(renderer, ids, mask) == "cba<|im_end|>"


def test_two_assistant_turns_are_both_trained(renderer, tmp_path):
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "xy"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "zw"},
    ]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    ids, mask = tokenize(renderer, conv, LossMaskConfig(), "x")
    assert _text(renderer, ids, mask) == "xy<|im_end|>zw<|im_end|>"
    # user turns trained too when [loss_mask] says so
    ids, mask = tokenize(renderer, conv, LossMaskConfig(user=True), "x")
    assert "a<|im_end|>" in _text(renderer, ids, mask) and "b<|im_end|>" in _text(renderer, ids, mask)


def test_message_loss_mask_keeps_only_the_selected_message(renderer, tmp_path):
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "xy"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "zw"},
    ]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs, "message_loss_mask": [0, 0, 0, 1]}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    ids, mask = tokenize(renderer, conv, LossMaskConfig(), "x")
    assert _text(renderer, ids, mask) == "zw<|im_end|>"
    # prompt/completion rows: the mask covers prompt + completion messages
    f = _jsonl(
        tmp_path / "e.jsonl",
        [
            {
                "prompt": [{"role": "user", "content": "a"}],
                "completion": [{"role": "assistant", "content": "q"}],
                "message_loss_mask": [True, False],
            }
        ],
    )
    (conv,), _ = load_conversations(f, ColumnsConfig())
    with pytest.raises(DataError, match="no token is trained"):
        tokenize(renderer, conv, LossMaskConfig(), "row 0")


def test_messages_win_over_prompt_completion_and_columns_are_renamed(tmp_path):
    f = _jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "conversation": [{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"}],
                "q": "p",
                "a": "c",
                "key": 7,
            }
        ],
    )
    cols = ColumnsConfig(messages="conversation", prompt="q", completion="a", id="key")
    (conv,), _ = load_conversations(f, cols)
    assert [m["content"] for m in conv.messages] == ["m", "n"] and conv.sample_id == "7"
    (conv,), _ = load_conversations(_jsonl(tmp_path / "e.jsonl", [{"q": "p", "a": "c"}]), cols)
    assert [(m["role"], m["content"]) for m in conv.messages] == [("user", "p"), ("assistant", "c")]


@pytest.mark.parametrize(
    "content, match",
    [
        (b'{"prompt": "a"}\n', r"row 0: needs a 'messages' column, or both 'prompt' and 'completion'"),
        (
            b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "b", "message_loss_mask": [1]}\n',
            r"row 1, column 'message_loss_mask': 1 entries for 2 messages",
        ),
        (b"", r"the dataset has no rows"),
        (b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", \n', r"row 1 \(line 2\): not valid JSON"),
        (b'{"prompt": "a", "completion": "\xff\xfe"}\n', r"row 0 \(line 1\): not UTF-8"),
        (b"[1, 2]\n", r"row 0: expected a JSON object"),
        (b'{"messages": [{"role": "robot", "content": "x"}]}\n', r"column 'messages', message 0: role 'robot'"),
    ],
)
def test_bad_rows_are_named_by_file_row_and_column(tmp_path, content, match):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(content)
    with pytest.raises(DataError, match=match) as e:
        check_dataset(f, ColumnsConfig())
    assert str(f) in str(e.value)


def test_a_sample_longer_than_seq_len_is_refused_before_training(renderer, tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "a" * 100, "completion": "b"}])
    convs, wheres = load_conversations(f, ColumnsConfig())
    with pytest.raises(DataError, match=r"d.jsonl: row 1: \d+ tokens > data.seq_len = 64"):
        SFTData.build(convs, renderer, LossMaskConfig(), seq_len=64, source=str(f), wheres=wheres)


def test_parquet_and_jsonl_give_the_same_samples(renderer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"Reverse: {w}", "completion": w[::-1]} for w in ("abc", "hello", "xy")]
    f = _jsonl(tmp_path / "d.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    built = []
    for path in (f, tmp_path / "d.parquet"):
        convs, wheres = load_conversations(path, ColumnsConfig())
        built.append(SFTData.build(convs, renderer, LossMaskConfig(), seq_len=128, source=str(path), wheres=wheres))
    assert built[0].input_ids.tolist() == built[1].input_ids.tolist()
    assert built[0].loss_mask.tolist() == built[1].loss_mask.tolist()


def test_data_order_is_a_function_of_the_step():
    n, b = 10, 4
    seen = [step_rows(n, batch_size=b, step=s, seed=3, shuffle=True)[0].tolist() for s in range(1, 6)]
    # steps 1-2 and the first half of 3 are epoch 0: every row once
    assert sorted(seen[0] + seen[1] + seen[2][:2]) == list(range(n))
    # asking again (a resumed run) gives the same rows; another seed another order
    assert step_rows(n, batch_size=b, step=4, seed=3, shuffle=True)[0].tolist() == seen[3]
    assert step_rows(n, batch_size=b, step=1, seed=4, shuffle=True)[0].tolist() != seen[0]
    rows, epoch = step_rows(n, batch_size=b, step=5, seed=3, shuffle=False)
    assert rows.tolist() == [6, 7, 8, 9] and epoch == 2.0


def test_a_packed_sample_has_the_logits_it_has_alone(renderer, tmp_path):
    import torch

    from toolkit.models import resolve_model
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.packing import plan_micro_batches

    rows = [{"prompt": f"Reverse: {w}", "completion": w[::-1]} for w in ("abcdef", "hello", "xyz", "qq")]
    f = _jsonl(tmp_path / "d.jsonl", rows)
    convs, wheres = load_conversations(f, ColumnsConfig())
    data = SFTData.build(convs, renderer, LossMaskConfig(), seq_len=512, source=str(f), wheres=wheres)
    model = load_policy(resolve_model("tiny-qwen3"))
    model.eval()
    (mb,) = plan_micro_batches(to_batch(data, np.arange(len(data)), 1), seq_len=512, micro_batch_size=1)
    assert mb.input_ids.shape[0] == 1 and (mb.sample_index >= 0).all()  # all four share one row
    with torch.no_grad():
        packed = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits[0]
        for i in range(len(data)):
            ids = torch.as_tensor(data.input_ids[data.offsets[i] : data.offsets[i + 1]], dtype=torch.long)[None]
            alone = model(input_ids=ids, use_cache=False).logits[0]
            cols = (mb.sample_index[0] == i).nonzero().flatten()
            assert torch.allclose(packed[cols], alone, atol=1e-5), i


def test_sft_config_names_fields_and_files(tmp_path):
    from toolkit.config import ConfigError

    f = tmp_path / "sft.toml"
    f.write_text('[data]\nname = "x.jsonl"\nbatch_size = 0\n[trainer.optim]\nlrr = 1\n')
    with pytest.raises(ConfigError) as e:
        load_sft_config([f])
    text = str(e.value)
    assert "data.batch_size" in text and "trainer.optim.lrr" in text and str(f) in text
    f.write_text('[data]\nname = "x.jsonl"\n[trainer.scheduler]\ntype = "cosine"\nwarmup_steps = 5\n')
    cfg = load_sft_config([f], ["--trainer.optim.lr", "0.01"])
    view = cfg.launch_view()
    assert view.trainer.optim.lr == 0.01 and view.trainer.seq_len == cfg.data.seq_len
    assert view.trainer.scheduler.type == "cosine"
