"""On-policy distillation end to end on CPU (real vLLM, real runs, nothing faked): a teacher served by
``srl inference``, a student run ``srl rl @ jobs/reverse-text/rl.toml @ jobs/reverse-text/opd.toml`` that scores its
own samples under it, and a student whose tokenizer differs, refused before its first rollout.

What the first run must show: every policy token of every batch is a distillation token (``ref_kl_mask``; the RL
term gets none), and its teacher logprob in the batch is exactly what transformers computes with the teacher's
weights for that token in that context (fp32, to 1e-4), so the trainer distils from the teacher's real opinion of
the student's own tokens; the step metrics carry the teacher-student KL and the trainer's ref-KL term.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prereqs import need_module
from run_records import metrics_lines, srl_background, srl_run, stop_background

from toolkit import batches
from toolkit.run.layout import RunDir

# background_half: scripts/test.sh runs this file's local tests (about 8 minutes) beside the Slurm tests, not in the
# foreground half, so the two halves take about as long.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.background_half]

torch = need_module("torch")
need_module("vllm")

from toolkit.models import build_tiny_model

REPO = Path(__file__).resolve().parents[2]


def _hf_distributions(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers fp32 log-distribution over the vocabulary of each token of ``ids`` given the tokens before it,
    ``[len(ids), V]`` (row 0: zeros)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return torch.cat([torch.zeros(1, lp.shape[1]), lp[:-1]])


def _hf_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    """transformers fp32 logprob of each token of ``ids`` given the tokens before it (position 0: 0.0)."""
    dist = _hf_distributions(model_dir, ids)
    return [0.0] + [dist[i, t].item() for i, t in enumerate(ids) if i > 0]


def _permuted_tokenizer(model_dir: Path) -> None:
    """Swap the ids of 'a' and 'e' in the tiny model's tokenizer: another tokenizer over the same vocabulary."""
    path = model_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    vocab["a"], vocab["e"] = vocab["e"], vocab["a"]
    path.write_text(json.dumps(tok))


# The student's train envs: reverse-text distils from the teacher deployment (TEACHER), arith learns by GRPO.
MIX = """
[[orchestrator.train.env]]
name = "reverse-text"
taskset = { id = "srl-reverse-text", split = "train", prompt = "Reverse: {text}" }
timeout = { rollout = 60, scoring = 10 }
max_total_tokens = 512
algo = { type = "opd", top_k = 5, teacher = { deployment = "TEACHER" } }

[[orchestrator.train.env]]
name = "arith"
taskset = { id = "srl-arith", split = "train" }
timeout = { rollout = 60, scoring = 10 }
max_total_tokens = 512
"""


def _student(out: Path, name: str, teacher_model: Path, *extra: str) -> list[str]:
    """``srl rl`` argv of the recipe with the teacher served by the deployment ``out/teacher`` instead of the run."""
    return [
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "@",
        str(REPO / "jobs/reverse-text/opd.toml"),
        "--output-dir",
        str(out),
        "--run.name",
        name,
        "--orchestrator.train.algo.teacher.serve",
        "false",
        "--orchestrator.train.algo.teacher.name",
        str(teacher_model),
        "--orchestrator.train.algo.teacher.deployment",
        str(out / "teacher"),
        "--orchestrator.eval.interval",
        "0",
        *extra,
    ]


def test_opd_student_distils_from_a_teacher_deployment_and_a_foreign_tokenizer_is_refused(tmp_path):
    out = tmp_path / "out"
    teacher_model = build_tiny_model(tmp_path / "teacher-model", seed=7)
    serve = srl_background(
        "inference", "@", str(REPO / "jobs/serve/tiny.toml"), "--output-dir", str(out), "--run.name", "teacher",
        "--model.name", str(teacher_model),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while not RunDir(out / "teacher").inference_ready.exists():
            assert serve.poll() is None, f"the teacher deployment exited:\n{serve.stdout.read()[-4000:]}"
            assert time.monotonic() < deadline, "the teacher deployment was not ready in 900 s"
            time.sleep(0.5)

        # -- a student with the same tokenizer distils on one env and runs GRPO on another ----------------------
        mix = tmp_path / "mix.toml"
        mix.write_text(MIX.replace("TEACHER", str(out / "teacher")))
        run = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", "rl", "@", str(REPO / "jobs/reverse-text/rl.toml"), "@", str(mix),
             "--output-dir", str(out), "--run.name", "student", "--max-steps", "2",
             "--orchestrator.eval.interval", "0"],
            cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
        root = out / "student"
        log = "\n".join(p.read_text() for p in (root / "logs").rglob("orchestrator*.log"))
        assert "shares the policy's tokenizer" in log
        lines = metrics_lines(root)
        orch = [m for m in lines if m.get("role") == "orchestrator" and "time/step" in m and m["step"] > 0]
        trainer = [m for m in lines if m.get("role") == "trainer" and "time/step" in m and m["step"] > 0]
        assert [m["step"] for m in orch] == [1, 2] and [m["step"] for m in trainer] == [1, 2]
        # per env: the teacher's metrics for the distilling env only, rewards for both
        assert all(m["teacher/reverse-text/kl"] != 0.0 and m["teacher/reverse-text/requests"] > 0 for m in orch)
        assert not any(k.startswith("teacher/arith/") for m in orch for k in m)
        assert all("reward/reverse-text/mean" in m and "reward/arith/mean" in m for m in orch)
        assert all(0.0 < m["teacher/scored_share"] < 1.0 for m in orch)  # arith's tokens are RL tokens
        # both terms train in one step
        assert all(m["train/ref_kl_tokens"] > 0 and m["train/rl_tokens"] > 0 for m in trainer), trainer

        batch = batches.load_batch_dir(RunDir(root).rollout_step(1))
        opd = [i for i in range(batch.num_samples) if batch.envs[i] == "reverse-text"]
        grpo = [i for i in range(batch.num_samples) if batch.envs[i] == "arith"]
        assert opd and grpo
        for i in grpo:
            sl = batch.sample_slice(i)
            assert batch.loss_mask[sl].any() and not batch.ref_kl_mask[sl].any()
        for i in opd[:4]:
            sl = batch.sample_slice(i)
            assert not batch.loss_mask[sl].any()
            ids = batch.input_ids[sl].tolist()
            want = _hf_logprobs(teacher_model, ids)
            mask = batch.ref_kl_mask[sl]
            got = batch.ref_logprobs[sl]
            diffs = [abs(float(g) - w) for g, w, m in zip(got, want, mask) if m]
            assert diffs and max(diffs) < 1e-4, (i, diffs)
            # top_k = 5: the teacher's five most likely tokens at each distillation position, most likely first
            top = _hf_distributions(teacher_model, ids).topk(5, dim=-1)
            for t in [t for t, m in enumerate(mask) if m]:
                assert batch.ref_topk_ids[sl][t].tolist() == top.indices[t].tolist(), (i, t)
                assert max(abs(float(a) - b) for a, b in zip(batch.ref_topk_logprobs[sl][t], top.values[t])) < 1e-4

        # -- a student with another tokenizer is refused before its first rollout ------------------------------
        foreign = build_tiny_model(tmp_path / "foreign-model", seed=0)
        _permuted_tokenizer(foreign)
        bad = subprocess.run(
            [sys.executable, "-m", "toolkit.cli",
             *_student(out, "foreign", teacher_model, "--max-steps", "2", "--model.name", str(foreign))],
            cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert bad.returncode != 0
        text = "\n".join(p.read_text() for p in (out / "foreign" / "logs").rglob("orchestrator*.log"))
        assert "does not share the policy's tokenizer" in text, text[-3000:]
        assert str(teacher_model) in text and str(foreign) in text  # both models named
        assert not RunDir(out / "foreign").rollout_step(1).exists()
    finally:
        stop_background(serve)


def _recipe_on_slurm(out: Path, name: str, *overrides: str) -> tuple[RunDir, Any]:
    """Submit ``srl rl @ rl.toml @ opd.toml @ slurm.toml`` (the recipe on the local cluster) with ``overrides``, wait
    for the job and assert it COMPLETED (its logs are the message); returns the run and the job's final state."""
    from run_records import submit_slurm_rl

    from toolkit.launch import slurm

    recipe = ("rl.toml", "opd.toml", "slurm.toml")
    run, job = submit_slurm_rl(
        out, name, *overrides, configs=tuple(str(REPO / "jobs/reverse-text" / c) for c in recipe)
    )
    state = slurm.wait(job, timeout_s=1500, poll_s=2.0)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(run.logs.rglob("*.log")))
    assert state.state == "COMPLETED", f"job {job} ended {state.state}\n{logs}"
    return run, state


@pytest.mark.slurm
@pytest.mark.heavy  # about 5 minutes: run with -m heavy (CI's budget holds the local OPD and OPSD runs)
def test_opd_on_slurm_with_the_teacher_in_its_own_allocation(tmp_path, slurm_cluster):
    """The teacher is an `srl inference` job of its own (one node), the student `srl rl @ rl.toml @ opd.toml @
    slurm.toml` another (three nodes): the student's job waits for the teacher's readiness, scores every batch under
    it across the cluster's network, and ends COMPLETED; cancelling the teacher afterwards leaves nothing running."""
    from run_records import processes_left

    out = tmp_path / "out"
    teacher_model = build_tiny_model(tmp_path / "teacher-model", seed=7)
    serve = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "inference", "@", str(REPO / "jobs/serve/tiny.toml"),
         "--site", "local-slurm", "--slurm.time", "00:30:00", "--output-dir", str(out), "--run.name", "teacher",
         "--model.name", str(teacher_model)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert serve.returncode == 0, serve.stdout + serve.stderr
    teacher = RunDir(out / "teacher")
    try:
        run, _state = _recipe_on_slurm(
            out,
            "student",
            "--max-steps",
            "2",
            "--orchestrator.train.algo.teacher.serve",
            "false",
            "--orchestrator.train.algo.teacher.name",
            str(teacher_model),
            "--orchestrator.train.algo.teacher.deployment",
            str(teacher.root),
            "--orchestrator.eval.env.reverse-text-test.num-examples",
            "8",
        )
        lines = metrics_lines(run.root)
        orch = [m for m in lines if m.get("role") == "orchestrator" and "teacher/scored_share" in m]
        trainer = [m for m in lines if m.get("role") == "trainer" and "ref_kl/mean" in m]
        assert [m["step"] for m in orch] == [1, 2] and [m["step"] for m in trainer] == [1, 2]
        assert all(m["teacher/scored_share"] == 1.0 for m in orch)
        ready = json.loads(teacher.inference_ready.read_text())
        orch_log = "\n".join(p.read_text() for p in run.logs.glob("attempt_*/orchestrator*.log"))
        assert f"at {ready.get('router_url') or ready['base_url']}/v1" in orch_log  # the teacher job's address
        assert processes_left(run.root) == []
    finally:
        subprocess.run(
            [sys.executable, "-m", "toolkit.cli", "cancel", str(teacher.root)],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip


def test_opsd_scores_with_the_policy_shown_the_demonstration(tmp_path):
    """Self-distillation on the policy's own engines: step 1's batch is sampled and scored before the trainer's
    first update, so each distillation token's reference logprob must be exactly the base model's (transformers,
    fp32, to 1e-4) for that token after the system message showing the task's answer, then the prompt and the
    completion before it; and it must differ from the logprob without that message (the sampler's own)."""
    from toolkit.config.model import AlgoConfig, RendererConfig
    from toolkit.models.renderer import load_renderer
    from toolkit.models.resolve import resolve_model

    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "rl", "@", str(REPO / "jobs/reverse-text/rl.toml"),
         "--orchestrator.train.algo.type", "opsd", "--max-steps", "1", "--orchestrator.max-async-level", "0",
         "--output-dir", str(out),
         "--run.name", "self", "--orchestrator.eval.interval", "0",
         "--orchestrator.eval.env.reverse-text-test.num-examples", "8"],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    root = out / "self"
    trainer = [m for m in metrics_lines(root) if m.get("role") == "trainer" and "ref_kl/mean" in m]
    assert [m["step"] for m in trainer] == [1]
    model = Path(resolve_model("tiny-qwen3"))
    renderer = load_renderer(RendererConfig(), model)
    template = AlgoConfig(type="opsd").template
    batch = batches.load_batch_dir(RunDir(root).rollout_step(1))
    assert not batch.loss_mask.any() and batch.ref_kl_mask.sum() > 0
    checked = 0
    for i in range(min(4, batch.num_samples)):
        sl = batch.sample_slice(i)
        ids = batch.input_ids[sl].tolist()
        p = int(batch.prompt_lens[i])
        text = renderer.decode(ids[:p]).split("Reverse: ", 1)[1].split("<|im_end|>", 1)[0]
        system = {"role": "system", "content": template.replace("{demonstration}", text[::-1])}
        hint = list(renderer.render([system], add_generation_prompt=False))
        shown = _hf_logprobs(model, hint + ids)[len(hint) :]
        unseen = _hf_logprobs(model, ids)
        mask = batch.ref_kl_mask[sl]
        got = [float(x) for x, m in zip(batch.ref_logprobs[sl], mask) if m]
        want = [w for w, m in zip(shown, mask) if m]
        plain = [w for w, m in zip(unseen, mask) if m]
        assert got and max(abs(g - w) for g, w in zip(got, want)) < 1e-4, (i, got, want)
        assert max(abs(g - w) for g, w in zip(got, plain)) > 1e-3  # the demonstration changed the opinion
        checked += 1
    assert checked


def _teacher_server_pid(run_root: Path) -> int:
    """pid of the vLLM API server of the run's served teacher (its environment names the process ``teacher-0``)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmdline = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"SRL_PROCESS=teacher-0" in env and f"SRL_RUN_DIR={run_root}".encode() in env and b"api_server" in cmdline:
            return int(d.name)
    raise AssertionError("no teacher-0 API server of the run is running")


def test_opd_with_the_teacher_served_by_the_run_itself(tmp_path):
    """``jobs/reverse-text/opd.toml`` as shipped: the run serves the teacher (``teacher.serve``) as one more engine
    of its plan. It is in the placement, healthy before the first rollout, scores every sampled token with the
    teacher's own weights (transformers fp32, to 1e-4), is stopped with the run, and never gets a weight update; a
    teacher that dies ends the run at once, naming it, and leaves nothing running."""
    from run_records import processes_left

    out = tmp_path / "out"
    teacher_model = build_tiny_model(tmp_path / "teacher-model", seed=7)

    def argv(name: str, steps: int) -> list[str]:
        recipe = ["rl", "@", str(REPO / "jobs/reverse-text/rl.toml"), "@", str(REPO / "jobs/reverse-text/opd.toml")]
        return [*recipe, "--orchestrator.train.algo.teacher.name", str(teacher_model), "--output-dir", str(out),
                "--run.name", name, "--max-steps", str(steps), "--orchestrator.eval.interval", "0",
                "--orchestrator.batch-size", "16"]  # fmt: skip

    run = srl_run(*argv("served", 2), cwd=REPO, timeout_s=900)
    assert "starting inference, teacher, trainer, orchestrator" in run.stdout
    root = out / "served"
    placement = json.loads((root / "launcher" / "placement.json").read_text())
    spec = next(p for p in placement["processes"] if p["name"] == "teacher-0")
    assert spec["role"] == "teacher" and spec["command"][spec["command"].index("--model") + 1] == str(teacher_model)
    orch_log = (root / "logs" / "attempt_1" / "orchestrator.log").read_text()
    assert f"at http://127.0.0.1:{spec['ports']['http']}/v1 shares the policy's tokenizer" in orch_log
    assert (root / "logs" / "attempt_1" / "teacher-0.log").is_file()
    lines = metrics_lines(root)
    orch = [m for m in lines if m.get("role") == "orchestrator" and "teacher/scored_share" in m]
    assert [m["step"] for m in orch] == [1, 2] and all(m["teacher/scored_share"] == 1.0 for m in orch)
    batch = batches.load_batch_dir(RunDir(root).rollout_step(2))
    for i in range(2):
        sl = batch.sample_slice(i)
        want = _hf_logprobs(teacher_model, batch.input_ids[sl].tolist())
        diffs = [abs(float(g) - w) for g, w, m in zip(batch.ref_logprobs[sl], want, batch.ref_kl_mask[sl]) if m]
        assert diffs and max(diffs) < 1e-4, (i, diffs)  # the teacher's weights, not the (updated) policy's
    # the policy's engine got the trainer's weights; the teacher was never a reload target
    reloads = (root / "policy_reloads.jsonl").read_text()
    assert str(spec["ports"]["http"]) not in reloads
    assert processes_left(root) == []

    # -- the teacher dies mid-run: the run ends naming it ----------------------------------------------------------
    proc = srl_background(*argv("dies", 40))
    killed = out / "dies"
    try:
        deadline = time.monotonic() + 600
        while not any(m.get("role") == "trainer" for m in (metrics_lines(killed) if killed.exists() else [])):
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "the run recorded no trainer step in 600 s"
            time.sleep(0.5)
        os.kill(_teacher_server_pid(killed), signal.SIGKILL)
        text = proc.communicate(timeout=300)[0]
    finally:
        stop_background(proc)
    assert proc.returncode != 0, text[-4000:]
    assert "teacher-0 exited with status -9" in text, text[-4000:]
    ending = json.loads((killed / "ending.json").read_text())
    assert "teacher-0" in json.dumps(ending), ending
    assert processes_left(killed) == []


@pytest.mark.slurm
def test_opd_on_slurm_with_the_teacher_served_in_a_het_group_of_the_job(tmp_path, slurm_cluster):
    """The recipe on the local Slurm cluster as shipped (``@ rl.toml @ opd.toml @ slurm.toml``, a multi-node run):
    the job itself serves the teacher on a node of its own (a heterogeneous component after the policy's and the
    trainer's nodes), scores every batch under it and ends COMPLETED with nothing left running."""
    from run_records import processes_left

    out = tmp_path / "out"
    teacher_model = build_tiny_model(tmp_path / "teacher-model", seed=7)
    run, state = _recipe_on_slurm(
        out,
        "student",
        "--max-steps",
        "2",
        "--orchestrator.train.algo.teacher.name",
        str(teacher_model),
        "--orchestrator.batch-size",
        "16",
        "--orchestrator.eval.interval",
        "0",
    )
    assert len(state.het_components) == 2  # the run's nodes, and the teacher's
    placement = json.loads((run.root / "launcher" / "placement.json").read_text())
    spec = next(p for p in placement["processes"] if p["name"] == "teacher-0")
    assert spec["het_group"] == 1 and placement["groups"][1]["first_node"] == spec["node_index"] == 3
    host = placement["hosts"][3]
    assert host not in {placement["hosts"][n] for n in range(3)}  # a node of its own
    lines = metrics_lines(run.root)
    orch = [m for m in lines if m.get("role") == "orchestrator" and "teacher/scored_share" in m]
    assert [m["step"] for m in orch] == [1, 2] and all(m["teacher/scored_share"] == 1.0 for m in orch)
    orch_log = "\n".join(p.read_text() for p in run.logs.glob("attempt_*/orchestrator*.log"))
    addr = placement["addresses"][3]
    assert f"at http://{addr}:{spec['ports']['http']}/v1 shares the policy's tokenizer" in orch_log
    assert processes_left(run.root) == []
