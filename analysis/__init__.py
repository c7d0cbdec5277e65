"""Offline analysis of srl runs: it reads run directories through :mod:`toolkit.run`, writes only its own reports,
and imports no torch, vLLM or role package (login nodes and report jobs run it).

- ``loaders``: a run's ``metrics.jsonl``, resolved config, run meta and rollout store as pandas frames.
- ``summary``: summaries of the rollout store per group, per (env, step), per env, and errors by class.
- ``figures``: matplotlib figures of a run or a sweep (off-screen).
- ``samples``: sample rollouts (best, worst, truncated) per env decoded to text, and truncated shares.
- ``report``: the HTML and Markdown report with CSV tables.
- ``diagnose``: what went wrong in a run, as failure boundaries with evidence and advice.
- ``envelope``: a run's resource and cost envelope (GPU-hours, disk, store growth, memory per GPU).

Entry points: ``python -m analysis.report RUN_DIR... [--out DIR]`` and ``python -m analysis.diagnose RUN_DIR``.
"""
