"""Offline analysis of srl runs: the HDF5 rollout store, pandas loaders and summaries, figures, reports, failure
diagnosis, resource envelope and stop criteria. Imports no torch or vLLM (login nodes and report jobs run it).

Entry points: ``python -m analysis.report RUN_DIR... [--out DIR]`` and ``python -m analysis.diagnose RUN_DIR``.
"""
