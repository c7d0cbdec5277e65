"""SmolLM2-135M-Instruct imported from its PyPI wheel loads in transformers and answers a simple question."""

from __future__ import annotations

import json
import time

import pytest
from prereqs import missing, need_module

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

torch = need_module("torch")
transformers = need_module("transformers")

from toolkit.models.smollm2 import find_smollm2_gguf, import_smollm2


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    try:
        find_smollm2_gguf()
    except RuntimeError as err:
        missing(str(err))
    start = time.monotonic()
    out = import_smollm2(tmp_path_factory.mktemp("smol") / "smollm2")
    print(f"import_smollm2 took {time.monotonic() - start:.1f} s")
    return out


def test_directory_is_untied_bf16_with_portable_tokenizer(smol_dir):
    config = json.loads((smol_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "quantization_config" not in config
    assert config["rope_theta"] == 100000.0  # mirrored for transformers 4.x
    tok_config = json.loads((smol_dir / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in tok_config["chat_template"]
    from safetensors import safe_open

    with safe_open(smol_dir / "model.safetensors", framework="pt") as f:
        lm_head = f.get_tensor("lm_head.weight")
        embed = f.get_tensor("model.embed_tokens.weight")
    assert lm_head.dtype == torch.bfloat16 and lm_head.shape == (49152, 576)
    assert torch.equal(lm_head, embed)


def test_greedy_answer_to_two_plus_two_contains_four(smol_dir):
    tok = transformers.AutoTokenizer.from_pretrained(smol_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(smol_dir)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    print("answer:", answer)
    assert "4" in answer
