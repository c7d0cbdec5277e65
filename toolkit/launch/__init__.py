"""Launching and following runs: the layer between a checked config (:mod:`toolkit.preflight`) and the roles.

Modules:
  prepare     the run directory of a new attempt (lease, configs, command line); refusals of a second launch
  pipeline    the one launch pipeline of every command that starts work: preflight (the plan, built once), the
              run directory, then the local supervisor or a Slurm submission (dry run: render only)
  local       ``srl rl`` on this machine: the supervisor over local child processes, the progress line, the ending;
              ``serve_local``: a config's engines (and router) served here for a block of code (the eval gate)
  supervisor  the one supervisor of a run's processes, local children or ``srun`` job steps inside the batch job
              (start order, readiness, engine restarts, stop/checkpoint/requeue, teardown, exit status)
  watchdog    the supervisor's progress watchdog: which role stopped making progress, for how long, doing what
  rendezvous  why a multi-node trainer's torchrun rendezvous failed: the trainer nodes that never joined
  submit      rendering the batch script into ``<run>/launcher/`` and ``sbatch`` (dependencies, job ids)
  sweeps      sweeps on Slurm: each point an ``srl rl`` batch job inside job arrays grouped by allocation shape
  slurm       Slurm from the login node: sbatch, squeue/sacct states, scancel, scontrol requeue
  replicas    elastic inference: ``srl inference join`` submits replica jobs; the run's end cancels them
  queue       queue-aware placement: Slurm's start estimate for the run's shape and smaller ones (fewer
              inference replicas), and ``--start-soonest``
  control     ``srl status``, ``srl cancel`` and ``srl logs`` of a run or sweep directory
  progress    what a run has done so far, from its run directory alone (steps, reward, ending, W&B sync line)
"""
