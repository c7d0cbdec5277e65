"""The teacher scorer of on-policy distillation: parsing vLLM's prompt logprobs, and the faults a real teacher can
only show by chance (server errors, an endpoint that is gone, a rejected request, a missing API key), injected by a
small HTTP server. Scoring against a real vLLM teacher: tests/integration/test_opd_teacher.py."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from toolkit.config.model import AlgoConfig, TeacherConfig
from toolkit.orchestrator import teacher as teacher_mod
from toolkit.orchestrator.teacher import TeacherError, TeacherScorer, prompt_token_logprobs
from toolkit.run.types import Rollout, TrainingSample


def _answer(ids, lps):
    """A vLLM /v1/completions answer with prompt logprobs: position 0 None, then {token id: {logprob, rank}}."""
    per = [None] + [{str(t): {"logprob": lp, "rank": 1, "decoded_token": "x"}} for t, lp in zip(ids[1:], lps[1:])]
    return {"choices": [{"text": "y", "prompt_logprobs": per}]}


def test_prompt_token_logprobs_reads_each_sent_token():
    ids = [5, 6, 7, 8]
    assert prompt_token_logprobs(_answer(ids, [0.0, -1.0, -2.0, -9999.0]), ids) == [0.0, -1.0, -2.0, -9999.0]
    assert prompt_token_logprobs({"choices": [{"text": "y"}]}, ids) is None  # no prompt logprobs (not vLLM)
    assert prompt_token_logprobs(_answer(ids[:3], [0, -1, -2]), ids) is None  # another number of positions
    other = _answer([5, 6, 9, 8], [0, -1, -2, -3])  # the teacher scored another token at position 2
    assert prompt_token_logprobs(other, ids) is None
    assert prompt_token_logprobs({"choices": []}, ids) is None


class _Teacher(ThreadingHTTPServer):
    """Answers /v1/completions (a list of token-id prompts, as the scorer sends them) with logprob -(token id)/10
    per position after ``fail_first`` HTTP 503s (or always with ``status``); records the Authorization headers it
    saw and the prompts per answered request."""

    def __init__(self, *, fail_first=0, status=None):
        self.fail_left, self.status, self.auth, self.calls = fail_first, status, [], 0
        self.batches: list[int] = []  # prompts per answered request

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(h):
                body = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
                self.calls += 1
                self.auth.append(h.headers.get("Authorization"))
                if self.status is not None or self.fail_left > 0:
                    self.fail_left -= 1
                    code = self.status or 503
                    h.send_response(code)
                    h.end_headers()
                    h.wfile.write(b"overloaded" if code >= 500 else b"bad request: prompt too long")
                    return
                self.batches.append(len(body["prompt"]))
                # vLLM's answer to a list of prompts: one choice per prompt, numbered by "index" (sent reversed here:
                # the scorer must match by index, not by list order)
                choices = [
                    {**_answer(ids, [-t / 10 for t in ids])["choices"][0], "index": i}
                    for i, ids in enumerate(body["prompt"])
                ]
                out = json.dumps({"choices": choices[::-1]}).encode()
                h.send_response(200)
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Length", str(len(out)))
                h.end_headers()
                h.wfile.write(out)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self):
        self.shutdown()
        self.server_close()  # nothing listens at the URL any more

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


@pytest.fixture(autouse=True)
def _no_retry_pause(monkeypatch):
    monkeypatch.setattr(teacher_mod, "RETRY_PAUSE_S", 0.0)


def _scorer(url, **cfg):
    t = TeacherConfig(name="t", base_url=url, **cfg)
    return TeacherScorer(
        t.name, url, max_concurrent=t.max_concurrent, timeout_s=t.timeout_s, api_key_var=t.api_key_var, label="env opd"
    )


async def _score(scorer, group):
    try:
        await scorer.score_group(group)
    finally:
        await scorer.aclose()


def test_scores_policy_tokens_after_server_errors_and_skips_errored_rollouts():
    srv = _Teacher(fail_first=2)  # two 503s, then answers: within the three tries
    try:
        smp = TrainingSample([1, 2], [30, 40, 50], [True, False, True], [-0.1, 0.0, -0.2])
        errored = Rollout(env="opd", task_id="t", example_id=0, samples=[TrainingSample([1], [9], [True], [-1.0])])
        errored.error_class = "TaskError"
        group = [Rollout(env="opd", task_id="t", example_id=0, samples=[smp]), errored]
        scorer = _scorer(srv.url)
        asyncio.run(_score(scorer, group))
        assert smp.ref_logprobs == pytest.approx([-3.0, 0.0, -5.0])  # the env's token 40 is not scored
        assert errored.samples[0].ref_logprobs is None and srv.calls == 3
        stats = scorer.drain_stats()
        assert stats["requests"] == 1 and stats["tokens"] == 2 and stats["latency_s"] > 0
        assert scorer.drain_stats()["requests"] == 0
    finally:
        srv.stop()


def test_a_teacher_that_keeps_failing_or_is_gone_raises_naming_it():
    smp = TrainingSample([1], [3], [True], [-0.1])
    srv = _Teacher(status=503)
    try:
        with pytest.raises(TeacherError, match=r"env opd: teacher 't' at http://127\.0\.0\.1:\d+/v1.*3 times.*503"):
            asyncio.run(_score(_scorer(srv.url), [Rollout(env="opd", task_id="t", example_id=0, samples=[smp])]))
        assert srv.calls == 3
    finally:
        srv.stop()
    gone = srv.url  # nothing listens there any more
    with pytest.raises(TeacherError, match="ConnectError"):
        asyncio.run(_score(_scorer(gone), [Rollout(env="opd", task_id="t", example_id=0, samples=[smp])]))


def test_a_rejected_request_is_not_retried():
    srv = _Teacher(status=400)
    try:
        smp = TrainingSample([1], [3], [True], [-0.1])
        with pytest.raises(TeacherError, match="HTTP 400: bad request"):
            asyncio.run(_score(_scorer(srv.url), [Rollout(env="opd", task_id="t", example_id=0, samples=[smp])]))
        assert srv.calls == 1
    finally:
        srv.stop()


def test_api_key_travels_by_variable_name_only(monkeypatch):
    srv = _Teacher()
    try:
        smp = TrainingSample([1], [3], [True], [-0.1])
        group = [Rollout(env="opd", task_id="t", example_id=0, samples=[smp])]
        with pytest.raises(TeacherError, match="TEACHER_API_KEY is not set"):
            asyncio.run(_score(_scorer(srv.url, api_key_var="TEACHER_API_KEY"), group))
        monkeypatch.setenv("TEACHER_API_KEY", "s3cret")
        asyncio.run(_score(_scorer(srv.url, api_key_var="TEACHER_API_KEY"), group))
        assert srv.auth == ["Bearer s3cret"]
    finally:
        srv.stop()


def test_teacher_config_names_one_source_and_opd_needs_one():
    assert TeacherConfig(deployment="outputs/teacher").name is None
    assert TeacherConfig(serve=True, name="outputs/sft/model").tp == 1
    for bad, msg in (
        ({"name": "t"}, "a teacher is one of"),
        ({"name": "t", "base_url": "http://h:1/v1", "deployment": "d"}, "a teacher is one of"),
        ({"name": "t", "deployment": "d", "serve": True}, "a teacher is one of"),
        ({"serve": True}, "needs its model directory"),
        ({"serve": True, "name": "m", "tp": 0}, "tp"),
        ({"base_url": "http://h:1/v1"}, "needs the model name"),
        ({"name": "t", "base_url": "h:1/v1"}, "base_url"),
        ({"deployment": "d", "api_key_var": "A-B"}, "api_key_var"),
    ):
        with pytest.raises(ValueError, match=msg):
            TeacherConfig(**bad)
    with pytest.raises(ValueError, match="needs a teacher"):
        AlgoConfig(type="opd")
    with pytest.raises(ValueError, match="used by type 'opd' only"):
        AlgoConfig(teacher={"deployment": "d"})
    with pytest.raises(ValueError, match="without advantages"):
        AlgoConfig(type="opd", teacher={"deployment": "d"}, length_penalty=0.1)


def test_the_demonstration_of_a_real_task_is_its_answer_or_nothing():
    from toolkit.config.model import TasksetConfig
    from toolkit.envs.registry import load_selected
    from toolkit.envs.server import demonstration

    _, tasks = load_selected(TasksetConfig(id="srl-reverse-text", split="test", prompt="Reverse: {text}"))
    task = tasks[0]
    text = task.data.prompt.removeprefix("Reverse: ")
    assert demonstration(task, "answer") == text[::-1] and text
    assert demonstration(task, "no_such_field") is None


def test_opsd_config_needs_its_placeholder_and_no_teacher():
    assert AlgoConfig(type="opsd").demo_key == "answer"
    with pytest.raises(ValueError, match="must contain"):
        AlgoConfig(type="opsd", template="Answer: {answer}")
    with pytest.raises(ValueError, match="used by type 'opd' only"):
        AlgoConfig(type="opsd", teacher={"deployment": "d"})


def test_prompt_top_logprobs_keeps_the_ranked_k_and_drops_the_sent_token():
    from toolkit.orchestrator.teacher import prompt_top_logprobs

    def pos(entries):  # {token: (logprob, rank)}
        return {str(t): {"logprob": lp, "rank": r, "decoded_token": "x"} for t, (lp, r) in entries.items()}

    answer = {
        "choices": [
            {
                "prompt_logprobs": [
                    None,
                    pos({7: (-0.1, 1), 9: (-2.5, 2), 3: (-6.0, 40)}),  # the sent token 3 ranks 40: left out
                    pos({4: (-1.0, 2), 5: (-0.5, 1)}),  # the sent token is among the top 2
                ]
            }
        ]
    }
    assert prompt_top_logprobs(answer, 2) == [([0, 0], [0.0, 0.0]), ([7, 9], [-0.1, -2.5]), ([5, 4], [-0.5, -1.0])]
    assert prompt_top_logprobs(answer, 3) is None  # a position with fewer than k ranked entries


def test_a_groups_samples_go_in_one_request_each_matched_to_its_own_answer(monkeypatch):
    srv = _Teacher()
    try:
        samples = [TrainingSample([1], [10 + i, 20 + i], [True, True], [-0.1, -0.1]) for i in range(5)]
        group = [Rollout(env="opd", task_id="t", example_id=0, samples=[s]) for s in samples]
        scorer = _scorer(srv.url)
        asyncio.run(_score(scorer, group))
        assert srv.batches == [5]  # one request for the whole group
        for i, s in enumerate(samples):  # each sample got its own prompt's logprobs, though the answer came reversed
            assert s.ref_logprobs == pytest.approx([-(10 + i) / 10, -(20 + i) / 10])
        # A batch holds at most MAX_BATCH_SAMPLES prompts; the rest go in the next requests.
        monkeypatch.setattr(teacher_mod, "MAX_BATCH_SAMPLES", 2)
        srv.batches.clear()
        scorer = _scorer(srv.url)
        asyncio.run(_score(scorer, group))
        assert sorted(srv.batches) == [1, 2, 2]
    finally:
        srv.stop()


def test_an_answer_with_the_wrong_number_of_choices_fails_every_sample_of_the_batch():
    srv = _Teacher()
    try:
        samples = [TrainingSample([1], [10 + i], [True], [-0.1]) for i in range(3)]
        group = [Rollout(env="opd", task_id="t", example_id=0, samples=[s]) for s in samples]
        scorer = _scorer(srv.url)

        async def short_post(url, body):
            return {"choices": [{"index": 0, "prompt_logprobs": None}]}

        scorer._post = short_post
        with pytest.raises(TeacherError, match="3 prompts sent in one request, but the answer holds 1 choices"):
            asyncio.run(_score(scorer, group))
    finally:
        srv.stop()
