"""The orchestrator role: rollouts from the environments, scored into groups, batched for the trainer.

Modules:
  main        ``srl orchestrator --run-dir RUN``: the async loop (train batches, eval, weight updates, stops)
  producer    keeps groups in flight within ``max_concurrent`` and the off-policy bound
  sampler     which env and task the next group uses (ratios, epoch-shuffled tasks; resumable)
  advantages  group-relative advantages of one group
  filtering   which groups carry learning signal (uniform rewards, thresholds)
  buffer      a trainer step's batch from finished groups
  teacher     on-policy distillation: a frozen teacher's logprobs of the policy's sampled tokens
  policy      the served policy version and the off-policy bound
  engines     the engine watch: a restarted engine gets the current weights before it serves a rollout
  replicas    elastic inference: replica jobs join (with the current weights) and leave the run's router
  evaluation  periodic held-out eval: avg@k and pass@k per eval env
  stop        stop criteria and the zero-signal guard
  records     the orchestrator's metrics line per step
  writer      rollout store appends and training batches, written by a child process
  state       the orchestrator's part of a checkpoint
"""
