"""The trainer role: RL and SFT on one process or torchrun ranks (FSDP2), checkpoints and weight broadcasts.

Modules:
  main          ``srl trainer --run-dir DIR``: settings, start-up shared by RL and SFT, the RL loop
  sft           the SFT loop (run when the resolved config is ``sft.json``), validation loss, final model export
  sft_data      SFT datasets -> conversations -> token ids with loss masks -> per-step batches (resumable order)
  step          one train step over micro-batches: loss, backward, clipping, optimizer and scheduler step
  loss          the RL loss (IPO, IcePop) and the optional CE term
  packing       samples -> packed rows of ``seq_len`` tokens -> micro-batches per rank
  optim         AdamW and the learning-rate schedules
  model         loading the policy, untying embeddings, full (gathered) weights for saving
  lora          peft LoRA: wrapping, the adapter on disk, merged weights
  dist          torch.distributed set-up: one process or torchrun ranks with FSDP2
  checkpoint    the trainer's part of a checkpoint (DCP under FSDP2)
  broadcast     the policy after step n as ``broadcasts/step_<n>/`` (STABLE last)
  export        ``srl export``: a complete checkpoint as a Hugging Face model directory
  metrics       parameter count and MFU
  wandb_mirror  ``[monitors.wandb]``: the run's metrics lines in one W&B run
"""
