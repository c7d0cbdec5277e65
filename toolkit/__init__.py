"""srl: post-training LLMs with asynchronous RL (and SFT) on verifier environments, on Slurm or on this machine.

Data flows one way: config -> preflight -> plan -> render/submit -> supervisor -> roles -> run directory -> analysis.
A package imports only the layers below it; ``lint-imports`` (the contracts in pyproject.toml) enforces the order.

Packages, lowest layer first:

- :mod:`toolkit.config`: the schema of every config, TOML composition and command-line overrides (a leaf).
- :mod:`toolkit.run`: the run directory; for each artifact its path, writer, reader and marker.
- :mod:`toolkit.models`: model aliases, the tiny local model, SmolLM2 from its wheel.
- :mod:`toolkit.engines`: engine and router command lines, health and ready files, the admin token (pure).
- :mod:`toolkit.placement`: the plan: which process runs where, with which ports, command and environment.
- :mod:`toolkit.preflight`: checks of what a config points at outside itself; builds the plan once.
- :mod:`toolkit.launch`: local runs and Slurm submissions, the one supervisor, status and control.
- Roles: :mod:`toolkit.inference` (vLLM engines, router, weight updates), :mod:`toolkit.orchestrator` (rollouts,
  groups, batches), :mod:`toolkit.envs` (tasksets and env workers), :mod:`toolkit.trainer` (RL and SFT).
- :mod:`toolkit.evalgate`: ``srl eval validate`` and ``srl eval run``, the gate before the first RL run.
- :mod:`toolkit.commands`: command implementations too large for ``cli``.

Modules of the top level:

- ``errors``: the error classes, one per failure boundary.
- ``fsutil``: crash-safe writes on a shared filesystem (atomic files and directories, markers).
- ``procutil``: process helpers (liveness, start times, process-group kills).
- ``batches``: the rollout-batch file the orchestrator hands the trainer for one step.
- ``checkpoints``: which checkpoints are complete, which one a resume loads, which ones retention deletes.
- ``lease``: the run lease (at most one supervisor per run directory).
- ``render``: sbatch scripts from a plan (Jinja2 templates in ``templates/``).
- ``sweep``: sweep files expanded into points, validated and run as job arrays.
- ``cli``: the ``srl`` command line.
"""
