"""Checks of what a run config points at outside itself: the model, the env runtimes and tasksets, the node
arithmetic of the deployment, and the files and run directories it names. Each check reads the config and reports; none
mutates it.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from ..config.errors import Findings
from ..config.model import RLConfig
from ..config.site import SiteConfig, job_python
from ..envs.fidelity import config_runtime_problem
from ..envs.tasksets import (
    BUILTIN_TASKSETS,
    ProbeError,
    file_stamp,
    known_taskset_ids,
    probe_spec,
    resolve_taskset_source,
    run_probe,
    taskset_module_candidates,
    taskset_unresolved_reason,
)
from ..models.resolve import MODEL_ALIASES
from ..placement.topology import TopologyError, derive_topology
from ..run.layout import RunDir
from .lora import check_lora


def check(cfg: RLConfig, *, purpose: str = "rl") -> Findings:
    """Run every check; returns errors and warnings (never raises). ``purpose`` "serve" skips the env runtimes
    (a serving deployment runs no environments). The tasksets are checked by :func:`check_tasksets` (it needs
    the site: the job's interpreter)."""
    f = Findings()
    for rule in (_output_dir, _model_name, _topology, check_lora, _references, _env_runtimes):
        if purpose == "serve" and rule is _env_runtimes:
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
    return (
        f"'{name}' is {where}; give a HF-format model directory or one of the built-in aliases: "
        f"{', '.join(sorted(MODEL_ALIASES))}"
    )


def _model_name(cfg: RLConfig, f: Findings) -> None:
    name = cfg.model.name
    why = unusable_model(name)
    if why:
        f.error("model.name", why)
        return
    run = RunDir(Path(name).expanduser())
    # An srl SFT run directory: its final model/ is written when that run finishes.
    if run.run_meta.is_file() and not (run.model_export / "config.json").is_file():
        f.warn(
            "model.name",
            f"run directory '{name}' has no final model yet ({run.model_export}); this run "
            "fails at start unless that SFT run finishes first (srl sft chain waits for it)",
        )


# ---- tasksets -------------------------------------------------------------------------------------------------
# Each env's taskset, checked on the login node as the job's env workers will load it, before anything starts. The
# ids are resolved and the taskset's config fields, ``select``, runtime and module checked by the probe of
# ``toolkit.envs.tasksets`` in a fresh process of the job's interpreter with the job's PYTHONPATH (no data read, no
# hub access). What the job would refuse is an error here, naming the env's field, the taskset, the module it
# resolved to and that module's own fields; an id that resolves nowhere is an error naming where it was looked for
# and the closest ids that do resolve. Only where this machine cannot reproduce the job's import path (the job runs
# in a container image, or its interpreter is not on this machine) are these warnings that say so.


def check_tasksets(cfg: RLConfig, site: SiteConfig | None, f: Findings) -> list[str]:
    """Probe every train and eval env's taskset (see the section comment above) and report into ``f``.

    Returns one notice per resolved env: where its taskset id resolves for the job. Raises nothing; a probe that
    cannot answer (its timeout, an interpreter that fails to start) is a finding, and the ids are then checked by
    path as far as this process can (``toolkit.envs.tasksets.taskset_unresolved_reason``).
    """
    entries = [(path, e) for path, e in cfg.orchestrator.env_entries() if e.taskset is not None]
    if not entries:
        return []
    extra = cfg.env_pythonpath()
    python, caveat = _job_interpreter(site)
    origins = [getattr(resolve_taskset_source(e.taskset.id, extra), "origin", None) for _, e in entries]
    try:
        results = run_probe(
            [probe_spec(e) for _, e in entries], python=python, extra_paths=extra, memo_key=file_stamp(origins)
        )
    except ProbeError as e:
        where = "; ".join(p for p, _ in entries)
        (f.warn if e.timed_out or caveat else f.error)(
            "orchestrator env tasksets", f"could not check the tasksets of {where} the way the job loads them: {e}"
        )
        _by_path(f, entries, extra)
        return []
    notices = []
    looked = _where_looked(python, extra)
    for (path, e), res in zip(entries, results, strict=True):
        tid = _clip(e.taskset.id)
        report = f.warn if caveat else f.error
        tail = f" (a warning, not an error: {caveat})" if caveat else ""
        if res["unresolved"] is not None:
            near = _close_ids(e.taskset.id, extra)
            hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else "no id close to it resolves; "
            tried = " then ".join(repr(_clip(m)) for m in taskset_module_candidates(e.taskset.id))
            # A typo of a built-in id is an error wherever the job runs: the built-ins are srl's own.
            (f.error if near and near[0] in BUILTIN_TASKSETS else report)(
                f"{path}.taskset.id",
                f"unknown taskset '{tid}': {res['unresolved']}; looked for module {tried} {looked}, and among "
                f"srl's built-in ids ({', '.join(sorted(BUILTIN_TASKSETS))}); {hint}give an installed environment's "
                f"id or put its module's directory on env_vars.PYTHONPATH{tail}",
            )
            continue
        for problem in res["problems"]:
            report(f"{path}.taskset", f"taskset '{tid}' resolves to {res['source']} for the job: {problem}{tail}")
        shadow = (
            " (an installed environment: srl's built-in of that id is not used)"
            if (e.taskset.id in BUILTIN_TASKSETS and not res["source"].startswith("srl's built-in"))
            else ""
        )
        section = "eval" if path.startswith("orchestrator.eval") else "train"
        notices.append(f"{section} env '{e.env_name}': taskset '{tid}' resolves to {res['source']}{shadow}")
    return notices


def _job_interpreter(site: SiteConfig | None) -> tuple[str, str | None]:
    """``(interpreter to probe with, why this machine cannot reproduce the job's import path or None)``: the job's
    own interpreter (``job_python``) when it is on this machine and the job does not run in a container."""
    if site is None:
        return sys.executable, None
    container = site.environment.container
    if container is not None:
        return sys.executable, (
            f"site '{site.name}' runs jobs in the container image {container.image}, whose "
            "Python this check does not enter"
        )
    python = job_python(site)
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        return sys.executable, f"the job's interpreter {python} is not on this machine"
    return python, None


def _where_looked(python: str, extra: list[str]) -> str:
    pp = os.pathsep.join(extra) if extra else f"the submitting shell's: {os.environ.get('PYTHONPATH') or 'none'}"
    # Python skips an entry that is no directory (a zip archive aside) without a word: say which.
    odd = [f"{_clip(p, 120)} is {why}" for p in extra if p and not p.endswith(".zip") and (why := _not_a_dir(p))]
    return (
        f"with the job's interpreter {python} and PYTHONPATH ({_clip(pp, 200)}"
        + (f"; {', '.join(odd)}" if odd else "")
        + ")"
    )


def _not_a_dir(path: str) -> str | None:
    """Why the PYTHONPATH entry ``path`` holds no modules ("a file: ...", "missing"), None for a directory."""
    try:
        if Path(path).is_dir():
            return None
        return "a file: put the directory that holds it on PYTHONPATH" if Path(path).exists() else "missing"
    except (OSError, ValueError):  # a NUL byte, a name too long
        return None


def _close_ids(taskset_id: str, extra: list[str]) -> list[str]:
    """Ids close to ``taskset_id`` that do resolve for the job: srl's built-ins, verifiers' own tasksets and the
    modules in the job's PYTHONPATH directories."""
    candidates = known_taskset_ids(extra)
    want = taskset_module_candidates(taskset_id)[1].replace("_", "-")
    by_norm = {c.replace("_", "-").lower(): c for c in candidates}
    return [by_norm[n] for n in difflib.get_close_matches(want, list(by_norm), n=3, cutoff=0.75)]


def _by_path(f: Findings, entries: list, extra: list[str]) -> None:
    """The look-up by path only, when the probe cannot answer: an id that resolves nowhere here is a warning (a
    typo of a built-in id an error)."""
    for path, e in entries:
        why = taskset_unresolved_reason(e.taskset.id, extra)
        if why is None:
            continue
        near = _close_ids(e.taskset.id, extra)
        hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
        (f.error if near and near[0] in BUILTIN_TASKSETS else f.warn)(
            f"{path}.taskset.id", f"unknown taskset '{_clip(e.taskset.id)}': {why}{hint}"
        )


def _clip(text: str, width: int = 80) -> str:
    """``text`` cut to ``width`` characters with an ellipsis: an id of thousands of characters stays readable."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _env_runtimes(cfg: RLConfig, f: Findings) -> None:
    """A runtime type srl cannot provide fails every env worker at start: an error naming the env. A container
    program missing on this machine is a warning (the compute nodes may have it; the worker checks there)."""
    for path, e in cfg.orchestrator.env_entries():
        found = config_runtime_problem(e.harness.runtime)
        if found is not None:
            (f.error if found[1] else f.warn)(f"{path}.harness.runtime.type", f"env '{e.env_name}': {found[0]}")


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
            f.error(
                "resume.dir",
                f"{cfg.resume.dir} holds no checkpoints ({ck} has no step directories): the fork "
                "would silently start at step 0; give the run directory that holds them",
            )
    if cfg.inference.external is not None and not Path(cfg.inference.external).expanduser().is_dir():
        # A warning, not an error: the directory may live on a filesystem this host does not mount.
        f.warn(
            "inference.external",
            f"{cfg.inference.external} is not a directory here; the orchestrator waits "
            "for that deployment's control/inference_ready.json until inference.startup_timeout_s; give the run "
            "directory of a deployment submitted with `srl inference`",
        )
    policy_deployment = Path(cfg.inference.external).expanduser().absolute() if cfg.inference.external else None
    for field, _env, algo in cfg.orchestrator.distilling_envs():
        teacher = algo.teacher
        if teacher is not None and teacher.serve:
            model = Path(teacher.name).expanduser()  # type: ignore[arg-type]
            if not (model / "config.json").is_file():
                # A warning, like the policy's model: a Slurm job may queue behind the SFT run that writes it, or the
                # directory may live on a filesystem this host does not mount; a local run refuses it at start.
                f.warn(
                    f"{field}.teacher.name",
                    f"{teacher.name} is not a model directory here (no config.json); a served teacher is an HF "
                    "model directory on a filesystem the job's nodes share, e.g. an SFT run's model/ folder, and its "
                    "engine fails at start without one",
                )
            continue
        if teacher is None or teacher.deployment is None:
            continue
        dep = Path(teacher.deployment).expanduser()
        if policy_deployment is not None and dep.absolute() == policy_deployment:
            f.error(
                f"{field}.teacher.deployment",
                f"{teacher.deployment} is also inference.external, the deployment this run loads its weights into; "
                "the teacher would change with the policy: give the teacher a deployment of its own",
            )
        elif not dep.is_dir():
            f.warn(
                f"{field}.teacher.deployment",
                f"{teacher.deployment} is not a directory here; the orchestrator waits for that deployment's "
                "control/inference_ready.json until inference.startup_timeout_s; start it with `srl inference`",
            )
    tpl = cfg.slurm.template_path
    if tpl is not None and not Path(tpl).expanduser().is_file():
        f.error("slurm.template_path", f"{tpl} is not a file")
