"""Weight versions that name their owner run: the engine middleware's record and completion tags (through the real
guard, over real HTTP for the real PolicyClient and WeightUpdater; a Starlette app stands in for vLLM's routes),
the orchestrator's verdict on each completion, the batch dropping another run's rollouts, and the deployment leases
that let LoRA runs share a deployment while refusing full-weight runs."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from asgi_server import ServedApp
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from toolkit import lease
from toolkit.engines.admin_token import ADMIN_TOKEN_HEADER
from toolkit.inference.client import PolicyClient
from toolkit.inference.guard import AdminGuard
from toolkit.inference.versions import (
    ADAPTER_VERSION_HEADER,
    VERSION_HEADER,
    VERSIONS_PATH,
    Verdict,
    format_version,
    judge,
    lora_name,
    parse_version,
)
from toolkit.inference.weights import WeightUpdater
from toolkit.orchestrator.buffer import BufferSettings, StepBatch
from toolkit.orchestrator.records import step_metrics
from toolkit.run.layout import RunDir
from toolkit.run.types import Rollout, SamplingParams, TrainingSample

TOKEN = "tok-" + "v" * 40
ADMIN = {ADMIN_TOKEN_HEADER: TOKEN}


def _app(gate: dict) -> Starlette:
    """Stands in for vLLM's routes behind the guard: loads answer 200 (or ``gate["fail"]``), a completion answers a
    fixed token after ``gate["hold"]`` (a threading.Event, when set) opens; ``gate["entered"]`` (an Event, when set)
    is set once a completion has reached the route, past the guard."""

    async def completion(request):
        body = await request.json()
        if gate.get("entered") is not None:
            gate["entered"].set()
        if gate.get("hold") is not None:
            await asyncio.to_thread(gate["hold"].wait, 10)
        return JSONResponse(
            {
                "model": body["model"],
                "choices": [
                    {"index": i, "token_ids": [7], "finish_reason": "length", "logprobs": {"token_logprobs": [-0.5]}}
                    for i in range(int(body.get("n") or 1))
                ],
            }
        )

    async def admin(request):
        body = await request.body()
        status = gate.get("fail", 200)
        if status == 200 and request.url.path == "/update_weight_version":  # what vLLM keeps for /weight_info
            gate["version"] = json.loads(body)["new_version"]
        return JSONResponse({"ok": status == 200}, status_code=status)

    async def weight_info(request):
        return JSONResponse({"weight_version": gate.get("version", "default")})

    return Starlette(
        routes=[
            Route("/v1/completions", completion, methods=["POST"]),
            Route("/weight_info", weight_info, methods=["GET"]),
            Route("/{path:path}", admin, methods=["GET", "POST"]),
        ]
    )


def _client(gate: dict) -> TestClient:
    app = _app(gate)
    app.add_middleware(AdminGuard, token=TOKEN)
    return TestClient(app)


def _complete(c: TestClient, model: str = "tiny") -> tuple[list[str], str | None]:
    r = c.post("/v1/completions", json={"model": model, "prompt": [1, 2]})
    assert r.status_code == 200
    return r.headers[VERSION_HEADER].split(","), r.headers.get(ADAPTER_VERSION_HEADER)


def test_version_strings_name_their_run():
    assert format_version("abc", 3) == "abc:3" and parse_version("abc:3") == ("abc", 3)
    assert format_version(None, 3) == "3" and parse_version("3") == (None, 3)
    assert parse_version("default") is None and parse_version("abc:x") is None
    assert parse_version("a:b:12") == ("a:b", 12)
    assert lora_name("abc") == "srl-lora-abc"


def test_the_engine_records_loads_it_admitted_and_tags_completions():
    gate: dict = {}
    c = _client(gate)
    assert _complete(c) == (["default"], None)  # never reloaded: vLLM's initial version
    # A load the guard refused, or one the engine failed, changes nothing.
    assert c.post("/update_weight_version", json={"new_version": "B:1"}).status_code == 401
    gate["fail"] = 500
    assert c.post("/update_weight_version", json={"new_version": "B:1"}, headers=ADMIN).status_code == 500
    gate.pop("fail")
    assert _complete(c)[0] == ["default"]
    assert c.post("/update_weight_version", json={"new_version": "A:1"}, headers=ADMIN).status_code == 200
    assert _complete(c) == (["A:1"], None)
    # An adapter carries its own version (header of its load); the base weights' version is left alone.
    r = c.post(
        "/v1/load_lora_adapter",
        json={"lora_name": "srl-lora-L", "lora_path": "/x", "load_inplace": True},
        headers={**ADMIN, VERSION_HEADER: "L:2"},
    )
    assert r.status_code == 200
    assert _complete(c, "srl-lora-L") == (["A:1"], "L:2")
    assert _complete(c, "srl-lora-other") == (["A:1"], None)  # not a loaded adapter: no adapter header
    assert c.get(VERSIONS_PATH).status_code == 401
    assert c.get(VERSIONS_PATH, headers=ADMIN).json() == {"base": "A:1", "adapters": {"srl-lora-L": "L:2"}}
    assert c.post("/v1/unload_lora_adapter", json={"lora_name": "srl-lora-L"}, headers=ADMIN).status_code == 200
    assert c.get(VERSIONS_PATH, headers=ADMIN).json()["adapters"] == {}


def test_a_completion_that_spans_a_load_lists_every_version_it_saw():
    gate: dict = {"hold": threading.Event(), "entered": threading.Event()}
    c = _client(gate)
    c.post("/update_weight_version", json={"new_version": "A:1"}, headers=ADMIN)
    answer: dict = {}
    t = threading.Thread(target=lambda: answer.update(v=_complete(c)))
    t.start()
    assert gate["entered"].wait(60), "the completion did not reach the app in 60 s"  # now waiting at the gate
    c.post("/update_weight_version", json={"new_version": "B:1"}, headers=ADMIN)  # another run's load meanwhile
    c.post("/update_weight_version", json={"new_version": "A:2"}, headers=ADMIN)
    gate["hold"].set()
    t.join(10)
    assert answer["v"] == (["A:1", "B:1", "A:2"], None)


@pytest.mark.parametrize(
    ("base", "adapter", "lora", "want"),
    [
        (["R:3"], None, False, Verdict(3)),
        (["R:3", "R:4"], None, False, Verdict(3)),  # a load during the request: the oldest counts
        (["default"], None, False, Verdict(0)),  # the base model: version 0 of any run
        (["R:3", "Q:3", "R:4"], None, False, Verdict(9, foreign="Q:3")),  # version 3 of run Q is not version 3 of R
        (["3"], None, False, Verdict(9, foreign="3")),  # a bare step names no run
        (["?"], None, False, Verdict(9, foreign="?")),
        ([], None, False, Verdict(9)),  # an engine without srl's middleware: the believed version
        (["default"], ["R:2"], True, Verdict(2)),
        (["default"], None, True, Verdict(0)),  # before the adapter's first load: the base model
        (["default"], ["R:2", "Q:5"], True, Verdict(9, foreign="adapter Q:5")),
        (["Q:1"], ["R:2"], True, Verdict(9, foreign="Q:1")),  # a full-weight run changed the base under the adapter
        (["R:1"], ["R:2"], True, Verdict(9, foreign="R:1")),
    ],
)
def test_judge(base, adapter, lora, want):
    assert judge("R", 9, base, adapter, lora=lora) == want
    assert judge(None, 9, base, adapter, lora=lora) == Verdict(9)  # no owner check outside a run


class _Server(ServedApp):
    """uvicorn serving the guarded stand-in app in a thread."""

    def __init__(self, gate: dict):
        app = _app(gate)
        app.add_middleware(AdminGuard, token=TOKEN)
        super().__init__(app)


def test_updaters_and_clients_of_two_runs_on_one_engine(tmp_path):
    """Run A loads full weights; run B's load (were it ever admitted) makes A's client mark what it sampled as
    foreign; a LoRA run's adapter is named and versioned after its run and leaves the base weights' version."""
    adapter = tmp_path / "broadcasts" / "step_2"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"x")

    async def go(url: str) -> dict:
        a, b, lo = (WeightUpdater([url], timeout_s=5, admin_token=TOKEN, run_id=r) for r in ("A", "B", "L"))
        ca = PolicyClient(url, "tiny", run_id="A")
        sp = SamplingParams(max_tokens=1)
        out = {}
        await a.update(tmp_path, 1)
        out["a1"] = await ca.generate([1], sp, session_id="s")
        out["info_a"] = await a.served_versions()
        await b.update(tmp_path, 1)
        out["b1"] = await ca.generate([1], sp, session_id="s")
        await a.update(tmp_path, 2)
        await lo.load_broadcast(adapter, 2)
        out["info_l"] = await lo.served_versions()
        cl = PolicyClient(url, lo.served_model, run_id="L", lora=True)
        out["l2"] = await cl.generate([1], sp, session_id="s")
        await ca.aclose()
        await cl.aclose()
        return out

    with _Server({}) as url:
        out = asyncio.run(go(url))
    assert out["info_a"] == {url: "A:1"}
    assert (out["a1"].policy_version, out["a1"].foreign_version) == (1, None)
    assert out["b1"].foreign_version == "B:1"
    assert out["info_l"] == {url: "L:2"}
    # The base weights are run A's here (a full-weight run under a LoRA run: what the leases refuse).
    assert out["l2"].foreign_version == "A:2"


def _rollout(reward: float, *, version: int = 0, foreign: str | None = None) -> Rollout:
    smp = TrainingSample([1, 2], [5, 6], [True, True], [-0.5, -0.5])
    return Rollout(
        env="a",
        task_id="t",
        example_id=0,
        samples=[smp],
        reward=reward,
        policy_version=version,
        foreign_version=foreign,
    )


def test_a_group_sampled_in_part_with_another_runs_weights_is_never_trained_on():
    b = StepBatch(step=2, settings=BufferSettings(batch_size=4))
    assert b.offer([_rollout(1, version=1), _rollout(0, version=1, foreign="B:1")]) == "foreign_policy"
    assert b.rollouts == [] and b.foreign_versions == ["B:1"]
    assert b.offer([_rollout(1, version=1), _rollout(0, version=1)]) is None
    m = step_metrics(b)
    assert m["off_policy/foreign_dropped"] == 2.0 and m["filter/dropped_groups/foreign_policy"] == 1.0
    assert len(b.rollouts) == 2 and all(r.foreign_version is None for r in b.rollouts)


def test_lora_runs_share_a_deployment_and_exclude_full_weight_runs(tmp_path):
    dep = RunDir(tmp_path / "serve")
    a, b, full = (RunDir(tmp_path / n) for n in ("a", "b", "full"))
    ta = lease.acquire_lora_tenant(dep, a, "ida", command="srl orchestrator")
    tb = lease.acquire_lora_tenant(dep, b, "idb", command="srl orchestrator")  # a second LoRA run: accepted
    assert sorted(h.run for h in lease.live_lora_tenants(dep)) == [str(a.root), str(b.root)]
    assert lease.deployment_refusal(dep, b, lora=True) is None
    why = lease.deployment_refusal(dep, full, lora=False)
    assert why is not None and "serves the LoRA adapter of run" in why and "srl cancel" in why
    with pytest.raises(lease.LeaseHeld, match="LoRA adapter of run"):
        lease.acquire_policy_owner(dep, full, command="srl orchestrator")
    assert lease.read_policy_owner(dep) is None  # the refused run gave its record back
    ta.release()
    tb.release()
    assert lease.live_lora_tenants(dep) == []
    owner = lease.acquire_policy_owner(dep, full, command="srl orchestrator")
    with pytest.raises(lease.LeaseHeld, match=f"already serves the weights of run {full.root}"):
        lease.acquire_lora_tenant(dep, a, "ida", command="srl orchestrator")
    assert not (dep.lora_tenants / "ida.json").exists()
    why = lease.deployment_refusal(dep, a, lora=True)
    assert why is not None and f"srl cancel {full.root}" in why
    owner.release()


def test_a_dead_lora_tenant_does_not_block_a_full_weight_run(tmp_path):
    dep = RunDir(tmp_path / "serve")
    dep.lora_tenants.mkdir(parents=True)
    now = time.time()
    dead = {
        "token": "t",
        "host": "elsewhere",
        "pid": 1,
        "pid_start": None,
        "job_id": None,
        "command": "srl",
        "acquired": now - 100,
        "renewed": now - 90,
        "expires": now - 45,
        "run": str(tmp_path / "gone"),
    }
    (dep.lora_tenants / "gone.json").write_text(json.dumps(dead))
    assert lease.live_lora_tenants(dep) == []
    lease.acquire_policy_owner(dep, RunDir(tmp_path / "full"), command="srl orchestrator").release()


def test_a_run_on_a_deployment_another_run_changed_loads_its_base_model_first(tmp_path):
    async def go(url: str) -> list:
        a, b = (WeightUpdater([url], timeout_s=5, admin_token=TOKEN, run_id=r) for r in ("A", "B"))
        out = [await a.reset_base(tmp_path)]  # vLLM's "default": the base model already
        await a.update(tmp_path, 3)
        out.append(await a.reset_base(tmp_path))  # its own weights (a resumed run): kept
        out.append(await b.reset_base(tmp_path))  # run A's weights: B loads its base model
        out.append(await b.served_versions())
        out.append(await b.reset_base(tmp_path))
        return out

    with _Server({}) as url:
        first, own, other, info, again = asyncio.run(go(url))
    assert first is None and own is None and again is None
    assert isinstance(other, float) and info == {url: "base"}
    assert judge("B", 0, ["base"]) == Verdict(0) and judge("B", 0, ["base"], None, lora=True) == Verdict(0)


def test_the_engine_watch_of_a_lora_run_probes_its_adapters_version(tmp_path):
    """A LoRA load leaves the base weights' version at "default": the watch must read the adapter's, or it takes
    the engine for restarted after every load and loads the adapter again and again."""
    import httpx

    from toolkit.orchestrator.engines import OK, RESTARTED, next_state, probe_engine

    adapter = tmp_path / "broadcasts" / "step_2"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"x")

    async def go(url: str) -> list:
        lo = WeightUpdater([url], timeout_s=5, admin_token=TOKEN, run_id="L")
        async with httpx.AsyncClient(headers=ADMIN) as http:
            before = await probe_engine(http, url, 5, lora_name("L"))
            await lo.load_broadcast(adapter, 2)
            after = await probe_engine(http, url, 5, lo.served_model)
            base = await probe_engine(http, url, 5)
        return [before, after, base]

    with _Server({}) as url:
        before, after, base = asyncio.run(go(url))
    assert before.version == "missing" and next_state(OK, before, 2, run_id="L") == RESTARTED  # a restarted engine
    assert after.version == "L:2" and next_state(OK, after, 2, run_id="L") == OK
    assert base.version == "default"  # what the watch read before, which never matched version 2
    assert next_state(OK, type(base)(True, "base"), 0, run_id="B") == OK  # the base model loaded back


def test_a_deployment_a_live_run_trains_cannot_be_a_teacher(tmp_path):
    dep, trainer_run = RunDir(tmp_path / "serve"), RunDir(tmp_path / "a")
    assert lease.teacher_refusal(dep) is None  # nobody loads weights into it: frozen
    owner = lease.acquire_policy_owner(dep, trainer_run, command="srl orchestrator")
    why = lease.teacher_refusal(dep)
    assert why is not None and f"run {trainer_run.root} trains" in why and "stay frozen" in why
    owner.release()
    assert lease.teacher_refusal(dep) is None
