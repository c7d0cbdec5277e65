"""Engines as the layers below the roles know them: how to start a vLLM engine or router, whether it serves, and
how to authenticate to its admin routes. Pure and login-node safe (no vllm, no torch): placement builds command
lines with it, preflight checks engine flags, the supervisor health-checks engines, and the orchestrator reads the
ready file; running, reloading and guarding an engine is the inference role's (``toolkit.inference``).

Modules:
  commands  engine_command / engine_env / router_command / ENGINE_DEFAULTS: argv and env builders
  health    is_healthy, write_ready / read_ready / clear_ready: readiness through <run>/control
  admin_token  SRL_ADMIN_TOKEN / X-SRL-Admin-Token: creating, passing and (inference-only runs) publishing it
  metrics   parse_metric: one metric from an engine's Prometheus /metrics text
  multinode  one engine spread over several nodes (data parallel across nodes): each node's argv
"""
