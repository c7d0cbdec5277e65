"""Cross-field rules of the run config. Each rule reads the config and reports; none mutates it, and none looks
outside it (files, models, tasksets, sites and node arithmetic are checked by :mod:`toolkit.preflight`).

Rules for pass-through arguments and the shape of references live in :mod:`toolkit.config.arg_rules`;
:func:`check` runs them all.

What they encode: whole groups per batch (group_size >= 8 advised), unique env names, a ratio on all train envs or
none, bounded stages, ``max_concurrent >= group_size * pool.max_workers`` (a smaller limit starves the env
workers), retained broadcasts covering the off-policy window, Slurm options srl owns itself, and secrets by name
only.
"""

from __future__ import annotations

import re
from collections import Counter

from .arg_rules import check_references as _references
from .arg_rules import check_row_fits_rollout as _row_fits_rollout
from .arg_rules import check_vllm_table as _vllm_table
from .convert import NATIVE_V1_FIELDS
from .errors import Findings
from .model import ENV_VAR_NAME, RLConfig
from .passthrough import option_key, vllm_tp
from .slurm_time import parse_slurm_time

# Group-relative algorithms: their advantage is zero for a group of one.
_GROUP_RELATIVE = {"grpo", "max_rl"}
# Env var names that carry credentials; their values must never be written to configs or scripts.
# A variable named ..._KEY (WANDB_KEY, OPENAI_KEY, SSH_KEY) or KEY holds a key as surely as ..._API_KEY does.
_SECRET_NAME = re.compile(r"(API_?KEY|(?:^|_)KEY$|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


def check(cfg: RLConfig, *, purpose: str = "rl") -> Findings:
    """Run every rule that applies to ``purpose``; returns errors and warnings (never raises).

    ``purpose``: "rl" (every rule); "serve" (``srl inference`` standalone: no training envs, groups, async or
    trainer); "sft" (the launch view of an SFT run, :meth:`toolkit.config.sft.SFTConfig.launch_view`: a trainer and
    at most eval envs, so the rules about train envs, groups, async and rollout lengths do not apply).
    Raises ValueError for another ``purpose``.
    """
    rules = (
        _batch_and_groups,
        _train_envs,
        _env_names,
        _concurrency,
        _env_pools,
        _async,
        _sampling,
        _deployment,
        _trainer_gpus,
        _weight_retention,
        _slurm,
        _secrets,
        _legacy_envs,
        _vllm_table,
        _references,
        _row_fits_rollout,
    )
    rl_only = {_batch_and_groups, _train_envs, _concurrency, _async, _weight_retention, _row_fits_rollout}
    skipped = {"rl": set(), "serve": rl_only | {_env_pools, _trainer_gpus}, "sft": rl_only}
    if purpose not in skipped:
        raise ValueError(f"purpose must be one of {sorted(skipped)}, not {purpose!r}")
    f = Findings()
    for rule in rules:
        if rule not in skipped[purpose]:
            rule(cfg, f)
    return f


def _nearest_multiples(n: int, k: int) -> str:
    lo = (n // k) * k
    hi = lo + k
    return f"{lo} or {hi}" if lo > 0 else f"{hi}"


def _batch_and_groups(cfg: RLConfig, f: Findings) -> None:
    o = cfg.orchestrator
    # (field, group size, algorithm): the run's group_size serves the envs without their own; it is held to the
    # group-relative rules when one of those envs computes advantages
    inherit = [o.env_algo(e).type for e in o.train.env if e.group_size is None] or [o.train.algo.type]
    sizes = [("orchestrator.group_size", o.group_size, next((a for a in inherit if a in _GROUP_RELATIVE), inherit[0]))]
    for i, env in enumerate(o.train.env):
        if env.group_size is not None:
            sizes.append((f"orchestrator.train.env[{i}].group_size", env.group_size, o.env_algo(env).type))
    for path, g, algo in sizes:
        if g == 1 and algo in _GROUP_RELATIVE:
            f.error(path, f"group-relative advantage ({algo}) needs group_size >= 2; with 1 every advantage is zero")
            continue
        if algo not in _GROUP_RELATIVE:  # distillation: the group only fans out sampling
            if o.batch_size % g:
                f.error(
                    f"orchestrator.batch_size, {path}",
                    f"batch_size {o.batch_size} is not a whole number of groups of {g}; "
                    f"use {_nearest_multiples(o.batch_size, g)}",
                )
            continue
        if g < 8:
            f.warn(
                path,
                f"group_size {g} is small: with fewer than 8 rollouts per task, few groups have differing rewards "
                "to learn from (16 is a common baseline)",
            )
        if o.batch_size % g:
            f.error(
                f"orchestrator.batch_size, {path}",
                f"batch_size {o.batch_size} is not a whole number of groups of {g}; "
                f"use {_nearest_multiples(o.batch_size, g)}",
            )


def _train_envs(cfg: RLConfig, f: Findings) -> None:
    o = cfg.orchestrator
    if not o.train.env:
        f.error("orchestrator.train.env", "at least one [[orchestrator.train.env]] is required")
    for i, env in enumerate(o.eval.env):
        if env.algo is not None:
            f.error(f"orchestrator.eval.env[{i}].algo", "an eval env trains nothing; set algo on train envs only")
    ratios = [e.ratio is not None for e in o.train.env]
    if any(ratios) and not all(ratios):
        missing = [e.env_name for e in o.train.env if e.ratio is None]
        f.error("orchestrator.train.env[].ratio", f"set ratio on every train env or on none; missing on {missing}")
    if o.eval.interval and not o.eval.env:
        f.warn("orchestrator.eval.interval", "eval interval is set but there is no [[orchestrator.eval.env]]")
    if not o.eval.env:
        f.warn(
            "orchestrator.eval.env",
            "no held-out eval env: without one nothing tells whether the run "
            "generalizes; add [[orchestrator.eval.env]] with a held-out split and set orchestrator.eval.interval",
        )


def _env_names(cfg: RLConfig, f: Findings) -> None:
    o = cfg.orchestrator
    for section, envs in (("train", o.train.env), ("eval", o.eval.env)):
        names = Counter(e.env_name for e in envs)
        for name, n in names.items():
            if n > 1:
                f.error(
                    f"orchestrator.{section}.env",
                    f"env name '{name}' is used {n} times; names must be unique (set 'name' when a taskset is reused)",
                )
        for i, e in enumerate(envs):
            if e.taskset is None and not e.legacy:
                f.error(f"orchestrator.{section}.env[{i}].taskset", 'missing: give taskset = { id = "..." }')


def _concurrency(cfg: RLConfig, f: Findings) -> None:
    o = cfg.orchestrator
    for i, env in enumerate(o.train.env):
        g = env.group_size or o.group_size
        need = g * env.pool.max_workers
        if o.max_concurrent < need:
            f.error(
                "orchestrator.max_concurrent",
                f"{o.max_concurrent} < group_size ({g}) x pool.max_workers ({env.pool.max_workers}) = {need} "
                f"for env '{env.env_name}' (orchestrator.train.env[{i}]); raise max_concurrent to >= {need}",
            )


# What srl's env runtime (toolkit/envs/runtime.py) implements: a fixed pool of ``max_workers`` worker processes,
# and no interception tunnels (the orchestrator samples the policy itself, token-in/token-out).
SUPPORTED_POOL_TYPES = ("static",)
SUPPORTED_POOL_MULTIPLEX = (1,)


def _env_pools(cfg: RLConfig, f: Findings) -> None:
    for path, env in cfg.orchestrator.env_entries():
        if env.pool.type not in SUPPORTED_POOL_TYPES:
            f.error(
                f"{path}.pool.type",
                f"pool type {env.pool.type!r} is not supported by srl, which runs a static pool of "
                f"pool.max_workers env worker processes; allowed: {list(SUPPORTED_POOL_TYPES)} (size the pool "
                "with pool.max_workers)",
            )
        if env.pool.multiplex not in SUPPORTED_POOL_MULTIPLEX:
            f.error(
                f"{path}.pool.multiplex",
                f"multiplex = {env.pool.multiplex} has no effect in srl: it samples the policy itself "
                f"(token-in/token-out), so there are no interception tunnels to share; allowed: "
                f"{list(SUPPORTED_POOL_MULTIPLEX)} (remove the field)",
            )


def _async(cfg: RLConfig, f: Findings) -> None:
    k = cfg.orchestrator.max_async_level
    if cfg.max_steps <= k:
        f.error(
            "max_steps, orchestrator.max_async_level",
            f"max_steps ({cfg.max_steps}) must exceed max_async_level ({k}); otherwise no policy is ever published "
            f"within the run; lower max_async_level to <= {cfg.max_steps - 1}",
        )


# Lowest train sampling temperature: the trainer divides logits by it (0 gives NaN logprobs from the first step),
# and vLLM samples greedily below 1e-5, where the engine's logprobs no longer describe what it drew.
MIN_TRAIN_TEMPERATURE = 0.01


def _sampling(cfg: RLConfig, f: Findings) -> None:
    base = cfg.orchestrator.train.sampling
    checks = [("orchestrator.train.sampling", base)]
    for i, env in enumerate(cfg.orchestrator.train.env):
        own = env.sampling.model_dump(exclude_none=True) if env.sampling is not None else {}
        if own.keys() & {"temperature", "top_p", "top_k"}:
            # What the env samples with: its set fields over the train sampling (the orchestrator merges them the
            # same way), so an inherited top_k counts and an override cannot switch off what top_p < 1 needs.
            # An env that sets none of them samples as the train sampling, checked above.
            checks.append((f"orchestrator.train.env[{i}].sampling", base.model_copy(update=own)))
            # The trainer scores a batch, whatever its envs, under the one distribution the batch records.
            differ = [k for k in ("temperature", "top_p", "top_k") if k in own and own[k] != getattr(base, k)]
            if differ:
                f.error(
                    ", ".join(f"orchestrator.train.env[{i}].sampling.{k}" for k in differ),
                    "a train env samples with orchestrator.train.sampling's temperature, top_p and top_k: the trainer "
                    "divides its logits by one temperature and truncates them one way per batch, and a batch mixes "
                    "envs; set them in [orchestrator.train.sampling] (a train env may still set its own "
                    "max_completion_tokens and seed; eval envs may set anything)",
                )
    for path, s in checks:
        if s.temperature < MIN_TRAIN_TEMPERATURE:
            f.error(
                f"{path}.temperature",
                f"train sampling needs temperature >= {MIN_TRAIN_TEMPERATURE} (got {s.temperature:g}): the loss "
                "weighs each token by its logprob under the sampled distribution, which the trainer gets by dividing "
                "the logits by the temperature; 0 is greedy decoding (no distribution to learn from) and near 0 the "
                "engine decodes greedily too. Use 1.0 to train on the policy itself (eval sampling may use 0)",
            )
        # The schema bounds top_k to [0, 512], so a truncation is ill-defined only as top_p < 1 without a top_k.
        if s.top_p < 1.0 and not s.top_k:
            f.error(
                f"{path}.top_k",
                "truncated train sampling (top_p < 1 or top_k set) needs 0 < top_k <= 512, so the sampled "
                "distribution and its logprobs stay well defined",
            )


def _served_teachers(cfg: RLConfig, f: Findings) -> None:
    """A teacher the run serves (``teacher.serve``) needs its ``tp`` GPUs: on a single node after the policy's and
    the trainer's, on a multi-node run on a node of its own (a heterogeneous component with the job's GPUs per
    node). Envs that share a teacher directory share its engine, so they must agree on its ``tp``."""
    dep = cfg.deployment
    teachers: dict[str, tuple[str, int]] = {}
    for fld, _env, algo in cfg.orchestrator.distilling_envs():
        t = algo.teacher
        if t is None or not t.serve:
            continue
        if t.name in teachers and teachers[t.name][1] != t.tp:
            first, tp = teachers[t.name]
            f.error(
                f"{fld}.teacher.tp",
                f"{t.tp}, but {first}.teacher.tp is {tp} for the same teacher {t.name}: one engine serves both envs",
            )
        teachers.setdefault(t.name, (fld, t.tp))  # type: ignore[index]
    if not teachers or not dep.gpus_per_node:
        return
    field = next(iter(teachers.values()))[0] + ".teacher.tp"
    tps = [t.tp for t in cfg.orchestrator.served_teachers()]
    if dep.type == "single_node":
        used = dep.num_train_gpus + dep.num_infer_gpus + sum(tps)
        if used > dep.gpus_per_node:
            f.error(
                field,
                f"num_train_gpus {dep.num_train_gpus} + num_infer_gpus {dep.num_infer_gpus} + the served "
                f"teachers' tp = {used} GPUs > gpus_per_node {dep.gpus_per_node}",
            )
    elif (tp := max(tps)) > dep.gpus_per_node:
        f.error(field, f"a served teacher's tp {tp} > deployment.gpus_per_node {dep.gpus_per_node} (its own node)")


def _distillation_limits(cfg: RLConfig, f: Findings) -> None:
    """Reference top-k within what srl's engines return (``inference.vllm.max_logprobs``: the policy's engines score
    ``opsd``, a served teacher shares their settings), and a run ``train.algo`` that some env uses."""
    o = cfg.orchestrator
    table = {option_key(k): v for k, v in cfg.inference.vllm.items()}
    limit = table.get("max_logprobs")
    for fld, _env, algo in o.distilling_envs():
        on_our_engines = algo.type == "opsd" or (algo.teacher is not None and algo.teacher.serve)
        if on_our_engines and isinstance(limit, int) and algo.top_k > limit:
            f.error(
                f"{fld}.top_k",
                f"{algo.top_k}, but inference.vllm.max_logprobs is {limit}: srl's engines would refuse every "
                "scoring request; raise max_logprobs to at least top_k or lower top_k",
            )
    envs = o.train.env
    if envs and all(e.algo is not None for e in envs) and o.train.algo.type != "grpo":
        f.warn(
            "orchestrator.train.algo",
            f"type {o.train.algo.type!r} applies to no env: every train env sets its own algo (its teacher, if any, "
            "is neither checked nor served)",
        )


def _deployment(cfg: RLConfig, f: Findings) -> None:
    dep = cfg.deployment
    tp = vllm_tp(cfg.inference.vllm)
    _served_teachers(cfg, f)
    _distillation_limits(cfg, f)
    if dep.type == "single_node":
        used = dep.num_train_gpus + dep.num_infer_gpus
        if used > dep.gpus_per_node:
            f.error(
                "deployment.num_train_gpus, deployment.num_infer_gpus",
                f"{dep.num_train_gpus} + {dep.num_infer_gpus} = {used} GPUs > gpus_per_node {dep.gpus_per_node}",
            )
        if dep.gpus_per_node and dep.cpu_train_ranks > 1:
            f.error(
                "deployment.cpu_train_ranks",
                "is for CPU-only nodes (gpus_per_node = 0); with GPUs the trainer "
                "has one rank per GPU: set deployment.num_train_gpus",
            )
        if dep.gpus_per_node and dep.num_infer_gpus % tp:
            f.error(
                "inference.vllm.tensor_parallel_size", f"tp {tp} does not divide num_infer_gpus {dep.num_infer_gpus}"
            )
        elif dep.gpus_per_node:
            _single_node_gpu_split(cfg, tp, f)
    else:
        if dep.gpus_per_node and dep.gpus_per_node % tp:
            f.error(
                "inference.vllm.tensor_parallel_size",
                f"gpus_per_node {dep.gpus_per_node} is not a multiple of tensor_parallel_size {tp}",
            )
        if dep.nodes_per_fsdp_group and dep.num_train_nodes % dep.nodes_per_fsdp_group:
            f.error(
                "deployment.nodes_per_fsdp_group",
                f"num_train_nodes {dep.num_train_nodes} is not a multiple of nodes_per_fsdp_group "
                f"{dep.nodes_per_fsdp_group}",
            )
        if cfg.site == "local":
            f.error("site", "a multi_node deployment needs a Slurm site (e.g. --site local-slurm)")
    # srl's trainer shards every parameter with FSDP2 over all its ranks (toolkit.trainer.dist): no tensor or
    # context parallelism, no HSDP groups. These fields only change the data-parallel size the plan reports.
    unused = [(p, v) for p, v in (("trainer.tp", cfg.trainer.tp), ("trainer.cp", cfg.trainer.cp)) if v > 1]
    if dep.type == "multi_node" and dep.nodes_per_fsdp_group:
        unused.append(("deployment.nodes_per_fsdp_group", dep.nodes_per_fsdp_group))
    for path, value in unused:
        f.warn(
            path,
            f"= {value} is not implemented by srl's trainer, which shards with FSDP2 over all trainer "
            "ranks (every rank data parallel); the value only changes the reported data-parallel size",
        )


def _single_node_gpu_split(cfg: RLConfig, tp: int, f: Findings) -> None:
    """On one GPU node the plan gives engine k GPUs [k*tp, (k+1)*tp) and the trainer the num_train_gpus after
    num_infer_gpus; unless the engines use exactly num_infer_gpus, an engine lands on the trainer's GPUs (or GPUs
    sit idle), and a trainer without GPUs would run on the CPU of a GPU node."""
    dep = cfg.deployment
    infer = cfg.inference.deployment
    if infer.type == "disaggregated":
        engines, what = infer.num_prefill_replicas + infer.num_decode_replicas, "prefill + decode replicas"
    else:
        engines, what = (infer.num_replicas if infer.type == "single_node" else 1), "inference.deployment.num_replicas"
    need = engines * tp
    if dep.num_infer_gpus != need:
        f.error(
            "deployment.num_infer_gpus",
            f"{dep.num_infer_gpus} GPUs, but {engines} engine(s) ({what}) x "
            f"tensor_parallel_size {tp} use {need}; set deployment.num_infer_gpus = {need} or change the "
            "engine count",
        )


def _trainer_gpus(cfg: RLConfig, f: Findings) -> None:
    """An RL run on one GPU node needs trainer GPUs: with num_train_gpus = 0 the plan starts one trainer rank with
    no GPU bound, which would run on the CPU (or on GPUs the engines use). A serving deployment needs none."""
    dep = cfg.deployment
    if dep.type == "single_node" and dep.gpus_per_node and dep.num_train_gpus < 1:
        free = dep.gpus_per_node - dep.num_infer_gpus
        f.error(
            "deployment.num_train_gpus",
            f"is 0 on a GPU node (gpus_per_node = {dep.gpus_per_node}): the trainer "
            f"needs at least one GPU of its own; allowed: 1..{max(1, free)}",
        )


def _weight_retention(cfg: RLConfig, f: Findings) -> None:
    need = cfg.orchestrator.max_async_level + 1
    keep = cfg.weight_broadcast.keep
    if keep is not None and keep < need:
        f.error(
            "weight_broadcast.keep",
            f"keep = {keep} would delete policies still in use: it must be >= max_async_level + 1 = {need}",
        )


def _time_limit(field: str, text: str, f: Findings) -> int | None:
    """Seconds of the Slurm time ``text`` of config ``field``; None (an error recorded) when it is no Slurm time."""
    try:
        return parse_slurm_time(text)
    except ValueError as e:
        f.error(field, str(e))
        return None


def _slurm(cfg: RLConfig, f: Findings) -> None:
    s = cfg.slurm
    limit = _time_limit("slurm.time", s.time, f)
    # The pre-timeout signal is only sent to a requeueable job (render.common_directives).
    if s.requeue and limit is not None and s.signal_lead_s >= limit:
        f.error("slurm.signal_lead_s", f"{s.signal_lead_s} s must be below the time limit ({s.time} = {limit} s)")
    elastic = getattr(cfg.deployment, "elastic", None)
    replica_limit = _time_limit("deployment.elastic.time", elastic.time, f) if elastic is not None else None
    if s.requeue and replica_limit is not None and s.signal_lead_s >= replica_limit:
        f.error(
            "deployment.elastic.time",
            f"{elastic.time} = {replica_limit} s must exceed slurm.signal_lead_s ({s.signal_lead_s} s): "
            "replica jobs are sent the run's pre-timeout signal that long before their limit",
        )
    if s.requeue and s.checkpoint_grace_s >= s.signal_lead_s:
        f.warn(
            "slurm.checkpoint_grace_s",
            f"checkpoint grace {s.checkpoint_grace_s} s >= signal lead {s.signal_lead_s} s: the job may hit its "
            "limit before the checkpoint completes",
        )
    uses_nccl = cfg.deployment.gpus_per_node > 0
    if s.signal == "USR1" and uses_nccl:
        f.warn("slurm.signal", "USR1 conflicts with NCCL's own SIGUSR1 handling; use USR2 (the default)")
    for d in s.extra_directives:
        if not d.startswith("--") or "\n" in d:
            f.error("slurm.extra_directives", f"'{d}' must be one long option like --mail-type=END")
        if d.startswith("--gpus-per-task"):
            f.error(
                "slurm.extra_directives",
                f"'{d}': per-task GPU binding hides the other local GPUs from each torchrun rank (no P2P/IPC "
                "between local ranks); srl runs one task per node and requests GPUs per node",
            )
        if d.startswith(("--output", "--error", "--nodes", "--job-name", "--signal", "--requeue")):
            f.error("slurm.extra_directives", f"'{d}' is set by srl; use the matching [slurm] field instead")
    if s.pre_run_command and re.search(r"\b(pkill|killall)\b", s.pre_run_command):
        f.warn(
            "slurm.pre_run_command",
            "pkill/killall by pattern can match srl's own job steps; srl already cleans up its own processes by PID",
        )
    for i, name in enumerate(s.secret_env_vars):
        if not ENV_VAR_NAME.fullmatch(name):
            # Not echoed: what stands here instead of a name is often the pasted secret itself.
            f.error(
                "slurm.secret_env_vars",
                f"item {i + 1} is not an environment variable name (letters, digits, "
                "'_'; not starting with a digit): list the names of exported variables, never their values",
            )


def env_tables(cfg: RLConfig) -> dict[str, dict[str, str]]:
    """Every user environment table of the config by its dotted path (the layers of the process environment)."""
    tables = {
        "env_vars": cfg.env_vars,
        "orchestrator.env_vars": cfg.orchestrator.env_vars,
        "trainer.env_vars": cfg.trainer.env_vars,
        "inference.env_vars": cfg.inference.env_vars,
    }
    dep = cfg.inference.deployment
    if dep.type == "disaggregated":
        tables["inference.deployment.prefill_env_vars"] = dep.prefill_env_vars
        tables["inference.deployment.decode_env_vars"] = dep.decode_env_vars
    return tables


def argument_tables(cfg: RLConfig) -> dict[str, dict]:
    """Every user table whose keys become program arguments, by dotted path: the vLLM pass-through table, each
    env's taskset fields beyond srl's own, and each legacy env's ``args``. Their values are written into the resolved
    configs and the placement (and vLLM's onto its command line), so none may carry a secret."""
    tables: dict[str, dict] = {"inference.vllm": cfg.inference.vllm}
    for path, e in cfg.orchestrator.env_entries():
        if e.taskset is not None and e.taskset.model_extra:
            tables[f"{path}.taskset"] = e.taskset.model_extra
        if e.args:
            tables[f"{path}.args"] = e.args
    return tables


# An argument name that carries a credential: api_key/apikey anywhere, or a last word naming one (hf_token,
# client_secret). Narrower than _SECRET_NAME so that max_num_batched_tokens or return_tokens_as_token_ids pass.
_SECRET_WORDS = {"token", "secret", "password", "passwd", "credential", "credentials"}


def is_secret_argument(key: str) -> bool:
    """Whether an argument name (snake or kebab case) names a credential, e.g. ``api_key``, ``hf-token``."""
    norm = option_key(key)
    return "api_key" in norm or "apikey" in norm or norm.rsplit("_", 1)[-1] in _SECRET_WORDS


def _secrets(cfg: RLConfig, f: Findings) -> None:
    for path, table in argument_tables(cfg).items():
        for key in table:
            if is_secret_argument(key):
                f.error(
                    f"{path}.{key}",
                    "looks like a secret; its value would be written into the run's resolved configs and placement "
                    "(and a program's command line). Export it in your shell under the name the program reads "
                    "(e.g. VLLM_API_KEY, HF_TOKEN) and list that name in slurm.secret_env_vars",
                )
    for path, table in env_tables(cfg).items():
        for key in table:
            if not ENV_VAR_NAME.fullmatch(key):
                f.error(f"{path}.{key}", "not a valid environment variable name")
            elif _SECRET_NAME.search(key):
                f.error(
                    f"{path}.{key}",
                    "looks like a secret; never put its value in a config. Export it in your shell and list its "
                    "name in slurm.secret_env_vars (srl passes names only)",
                )


def _legacy_envs(cfg: RLConfig, f: Findings) -> None:
    for path, e in cfg.orchestrator.env_entries():
        misplaced = sorted(NATIVE_V1_FIELDS & set(e.args or ()))
        if misplaced:
            f.error(
                f"{path}.args",
                f"native v1 fields {misplaced} belong at the env entry's top level, not under args "
                "(args is the legacy v0 bridge); move them out of args",
            )
        if e.id is not None and e.taskset is not None and not e.legacy:
            f.error(path, "give either taskset (native v1) or id/args (legacy v0)")
