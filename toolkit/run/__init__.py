"""The run directory protocol: for each artifact of a run directory, its writer and its reader.

- ``layout``: every path of a run directory (``RunDir``), the STABLE / COMPLETE / READY markers and the newest
  STABLE broadcast (``newest_stable_broadcast``: what engines load and ``srl status`` reports).
- ``ending``: how a run (its latest attempt) ended, ``ending.json``, and the exit status that ending maps to.
- ``metrics``: ``metrics.jsonl``, its readers (whole file, tail, follower) and shared metric names.
- ``control``: the stop request in ``control/`` that asks every role to stop (with the criterion that fired).
- ``heartbeat``: each role's progress record ``progress/<key>.json`` (phase, step, progress and beat counters) and the
  signal on which a role dumps its Python stacks, read by the supervisor's progress watchdog.
- ``launcher``: the local launcher record ``launcher/local.json`` (pid, host, attempt; its exit status once ended).
- ``stop``: the stop criteria (``[monitors.stop]``) over per-step metrics: the orchestrator checks them live, reports
  replay ``metrics.jsonl`` through the same monitor.
- ``store``: the rollout store ``store/rollouts.h5`` (HDF5 schema, the appending writer, the reader to a DataFrame),
  written by the orchestrator and the eval gate, read by reports and ``srl diagnose``.
- ``types``: the records a run produces and passes between roles (``Generation``, ``Rollout``, ``TrainingSample``,
  ``SamplingParams``) and the rollout error classes.
- ``verdict``: the eval gate's verdict files ``reports/eval_{validate,gate}.{json,md}``, their writer and readers.
"""
