"""Environments: verifiers v1 tasksets (built-in and external), env worker processes and the runtime facade.

Public entry point: ``toolkit.envs.runtime.EnvRuntime``. Importing this package imports nothing heavy.
"""
