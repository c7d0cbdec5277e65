"""Command implementations that are too large for ``toolkit/cli.py`` (the CLI layer: parse, call a layer, print).

Modules:
  sft   ``srl sft``: SFT runs (prepare, place the trainer, launch or submit), ``make-data`` (rows from a
        taskset's reference answers) and ``chain`` (SFT, then RL from its final model; Slurm: afterok)
  export  ``srl export RUN [--step N] DIR``: argument checks before any weights load (the export is the trainer's)
  inference  ``srl inference``: a standalone deployment (engines + router) through the same preflight, plan,
        prepare and launch as ``srl rl``; ``queues`` (waiting requests per engine role)
"""
