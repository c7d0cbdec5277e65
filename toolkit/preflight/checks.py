"""Checks of what a run config points at outside itself: the model, the taskset modules, the node arithmetic of the
deployment, and the files and run directories it names. Each check reads the config and reports; none mutates it.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from ..config.errors import Findings
from ..config.model import RLConfig
from ..envs.fidelity import config_runtime_problem
from ..envs.tasksets import (
    BUILTIN_TASKSETS,
    resolve_taskset_source,
    taskset_module_candidates,
    taskset_unresolved_reason,
)
from ..models.resolve import MODEL_ALIASES
from ..placement.topology import TopologyError, derive_topology
from ..run.layout import RunDir
from .lora import check_lora


def check(cfg: RLConfig, *, purpose: str = "rl") -> Findings:
    """Run every check; returns errors and warnings (never raises). ``purpose`` "serve" skips the taskset look-up
    (a serving deployment runs no environments)."""
    f = Findings()
    for rule in (_output_dir, _model_name, _topology, check_lora, _references, _taskset_ids, _env_runtimes):
        if purpose == "serve" and rule in (_taskset_ids, _env_runtimes):
            continue
        rule(cfg, f)
    return f


def _output_dir(cfg: RLConfig, f: Findings) -> None:
    """``output_dir`` must be able to hold run directories: its nearest existing ancestor is a directory in which a
    directory can be made. Checked by making (and removing) an empty one there, because permission bits say
    nothing on read-only mounts or pseudo filesystems (``/proc``, where even root cannot create anything)."""
    import tempfile

    out = Path(cfg.output_dir).expanduser().absolute()
    first = next((p for p in (out, *out.parents) if p.exists() or p.is_symlink()), out)
    why = None
    if not first.is_dir():
        why = f"{first} is not a directory"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".srl-probe-", dir=first))
        except OSError as e:
            why = f"cannot create a directory in {first} ({e.strerror or e})"
    if why:
        f.error("output_dir", f"{out}: cannot hold run directories: {why}; give another output_dir")


def unusable_model(name: str) -> str | None:
    """Why ``name`` (``model.name``, or ``srl eval run -m``) names no model, ending with what to give instead; None
    for a built-in alias, a HF-format directory or an srl SFT run directory (its final ``model/``)."""
    path = Path(name).expanduser()
    if name in MODEL_ALIASES or (path / "config.json").is_file() or RunDir(path).run_meta.is_file():
        return None
    where = "a directory without config.json" if path.is_dir() else "neither an alias nor a directory"
    return (f"'{name}' is {where}; give a HF-format model directory or one of the built-in aliases: "
            f"{', '.join(sorted(MODEL_ALIASES))}")


def _model_name(cfg: RLConfig, f: Findings) -> None:
    name = cfg.model.name
    why = unusable_model(name)
    if why:
        f.error("model.name", why)
        return
    run = RunDir(Path(name).expanduser())
    # An srl SFT run directory: its final model/ is written when that run finishes.
    if run.run_meta.is_file() and not (run.model_export / "config.json").is_file():
        f.warn("model.name", f"run directory '{name}' has no final model yet ({run.model_export}); this run "
                             "fails at start unless that SFT run finishes first (srl sft chain waits for it)")


def _taskset_ids(cfg: RLConfig, f: Findings) -> None:
    """A taskset id that resolves nowhere fails the orchestrator minutes after submission; say so now. An error
    when it is one edit away from a built-in id (a typo), else a warning saying why it does not resolve: the job's
    environment (its PYTHONPATH, a site's setup lines) may provide a module this interpreter cannot see. Imports
    nothing (``toolkit.envs.tasksets.taskset_unresolved_reason`` locates modules by path and import hooks only)."""
    extra = cfg.env_pythonpath()
    builtins = sorted(BUILTIN_TASKSETS)
    for path, e in cfg.orchestrator.env_entries():
        why = None if e.taskset is None else taskset_unresolved_reason(e.taskset.id, extra)
        if why is None:
            continue
        tid = _clip(e.taskset.id)
        tried = " or ".join(repr(_clip(m)) for m in taskset_module_candidates(e.taskset.id))
        near = difflib.get_close_matches(e.taskset.id, builtins, n=1, cutoff=0.8)
        where = f"{path}.taskset.id"
        if near:
            f.error(where, f"unknown taskset '{tid}': did you mean '{near[0]}'? Built-in ids: "
                           f"{', '.join(builtins)}; any other id must name an importable module ({tried})")  # fmt: skip
        else:
            f.warn(where, f"taskset '{tid}' is not built in ({', '.join(builtins)}) and does not resolve here "
                          f"({why}; tried {tried}); the orchestrator will fail at start unless the job's "
                          "environment provides it (e.g. env_vars.PYTHONPATH)")  # fmt: skip


def taskset_notices(cfg: RLConfig) -> list[str]:
    """One line per env: where its taskset id resolves on this machine (verifiers' order: verifiers' taskset
    package, an importable module, then srl's built-in), for the dry run and the resolved config. Imports nothing;
    the env workers resolve the id again on their node and log what they loaded."""
    extra = cfg.env_pythonpath()
    out = []
    for section, envs in (("train", cfg.orchestrator.train.env), ("eval", cfg.orchestrator.eval.env)):
        for e in envs:
            if e.taskset is None:
                continue
            source = resolve_taskset_source(e.taskset.id, extra)
            if source is None:
                continue  # _taskset_ids reports it
            shadow = " (an installed environment: srl's built-in of that id is not used)" if (
                source.kind != "builtin" and e.taskset.id in BUILTIN_TASKSETS) else ""  # fmt: skip
            out.append(f"{section} env '{e.env_name}': taskset '{_clip(e.taskset.id)}' resolves to "
                       f"{source.describe()}{shadow}")  # fmt: skip
    return out


def _env_runtimes(cfg: RLConfig, f: Findings) -> None:
    """A runtime type srl cannot provide fails every env worker at start: an error naming the env. A container
    program missing on this machine is a warning (the compute nodes may have it; the worker checks there)."""
    for path, e in cfg.orchestrator.env_entries():
        found = config_runtime_problem(e.harness.runtime)
        if found is not None:
            (f.error if found[1] else f.warn)(f"{path}.harness.runtime.type", f"env '{e.env_name}': {found[0]}")


def _clip(text: str, width: int = 80) -> str:
    """``text`` cut to ``width`` characters with an ellipsis: an id of thousands of characters stays readable."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _topology(cfg: RLConfig, f: Findings) -> None:
    """The deployment's node arithmetic must work out (:func:`derive_topology` says why it does not)."""
    try:
        derive_topology(cfg)
    except TopologyError as e:
        f.error("deployment", str(e))


def _references(cfg: RLConfig, f: Findings) -> None:
    """Files and run directories the config names must exist where srl can check it now.

    A ``resume.dir`` without checkpoints would make the fork start silently at step 0 (the trainer treats a run
    without step directories as a fresh start); a missing ``inference.external`` would make the
    orchestrator wait out its timeout for a deployment that never comes.
    """
    if cfg.resume.dir is not None:
        ck = RunDir(Path(cfg.resume.dir).expanduser()).checkpoints
        if not ck.is_dir() or not any(p.name.startswith("step_") for p in ck.iterdir()):
            f.error("resume.dir", f"{cfg.resume.dir} holds no checkpoints ({ck} has no step directories): the fork "
                    "would silently start at step 0; give the run directory that holds them")  # fmt: skip
    if cfg.inference.external is not None and not Path(cfg.inference.external).expanduser().is_dir():
        # A warning, not an error: the directory may live on a filesystem this host does not mount.
        f.warn("inference.external", f"{cfg.inference.external} is not a directory here; the orchestrator waits "
               "for that deployment's control/inference_ready.json until inference.startup_timeout_s; give the run "
               "directory of a deployment submitted with `srl inference`")  # fmt: skip
    tpl = cfg.slurm.template_path
    if tpl is not None and not Path(tpl).expanduser().is_file():
        f.error("slurm.template_path", f"{tpl} is not a file")
