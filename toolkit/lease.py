"""The run lease: at most one supervisor runs a run directory at a time.

Whoever supervises a run (the local launcher, ``srl sweep run-point`` inside an array task, the login-node command
while it prepares a Slurm submission) holds ``<run>/launcher/lease.json``. The record names the holder (host, PID
and its start time, Slurm job id, command) and an expiry; a heartbeat thread renews it every ``RENEW_S`` seconds.
A launch that finds a live holder is refused (:class:`LeaseHeld` names it); a dead holder's lease is taken over and
the takeover appended to ``launcher/lease_history.jsonl``.

A holder is dead when its expiry has passed (``TTL_S`` after its last renewal: the only test that works across
hosts), or, on the holder's own host, when its PID is gone or belongs to a later process. A Slurm job that was
requeued takes over the lease its previous incarnation left (same job id: that incarnation is over).

Why files and renames, not ``flock``: locks are unreliable on the shared filesystems runs live on (NFS, Lustre),
while creating a file with ``link(2)`` (fails when the name exists) and ``rename(2)`` are atomic there. A stale
record is taken over by first linking it to a claim named after its bytes, which only one racer can create, then
checking that the claimed file still holds the record judged stale and replacing it: of several launches racing for
one stale lease, exactly one takes it over, and nobody ever moves a fresh record out of the way.

Roles started under a lease get its token in ``SRL_RUN_LEASE`` and watch it (:func:`watch`): when the lease
belongs to someone else, or its holder is dead, they exit instead of writing into a run they no longer belong to.

The same kind of lease, in an inference deployment's directory (``launcher/policy_owner.json``), names the one run
whose weights the deployment serves (:func:`acquire_policy_owner`, taken by that run's orchestrator): two runs
loading their weights into one engine would each train on rollouts sampled with the other's policy. Runs that train
LoRA adapters may share a deployment, each loading only its own adapter (named after its run id): each holds a
LoRA-tenant lease (``launcher/lora_tenants/<run id>.json``, :func:`acquire_lora_tenant`). A full-weight owner and a
LoRA tenant exclude each other (a full-weight load changes the base model under every adapter): each takes its own
record first and then looks for the other kind, giving its record back when it finds one, so of two racing launches
at most one is accepted.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AllowInfNan, Strict, StrictInt, StrictStr, TypeAdapter

from .fsutil import append_jsonl
from .procutil import pid_alive, process_start_time
from .run.layout import RunDir

log = logging.getLogger(__name__)

LEASE_ENV = "SRL_RUN_LEASE"  # the token of the lease a role was started under
RENEW_S = 5.0  # seconds between renewals
# Seconds a record stays valid after its last renewal. Generous against clock skew between hosts and attribute
# caching of shared filesystems; on the holder's own host a dead PID is noticed at once, without waiting for it.
TTL_S = 45.0
WATCH_S = 5.0  # seconds between a role's looks at the lease
# A Unix time in a record: a string or NaN expiry (a hand-edited or foreign record) made every reader of the lease
# die with a TypeError, or read as a holder alive forever.
_Seconds = Annotated[float, Strict(), AllowInfNan(False)]


class LeaseHeld(RuntimeError):
    """Another live process holds the lease. ``holder`` is its record; ``slot`` the lease (path, what it guards)."""

    def __init__(self, slot: _Slot, holder: Holder):
        self.slot, self.holder = slot, holder
        super().__init__(slot.refusal(holder))


class LeaseLost(RuntimeError):
    """This process's lease was taken over or removed by someone else."""


@dataclass(frozen=True)
class Holder:
    """One lease record. Times are Unix seconds (the holder's clock). The strict types are checked when a record
    is read (:func:`_parse`), not when srl builds one."""

    token: StrictStr
    host: StrictStr
    pid: StrictInt
    pid_start: StrictInt | None
    job_id: StrictStr | None
    command: StrictStr
    acquired: _Seconds
    renewed: _Seconds
    expires: _Seconds
    run: StrictStr = ""  # the run directory the holder supervises (a policy owner: its own run, not the deployment)

    def describe(self) -> str:
        """``srl (pid P on host H, Slurm job J, since ..., renewed N s ago)`` for messages."""
        where = f"pid {self.pid} on host {self.host}" + (f", Slurm job {self.job_id}" if self.job_id else "")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        return f"{self.command} ({where}, since {since}, renewed {max(0.0, time.time() - self.renewed):.0f} s ago)"

    def dead_reason(self, now: float | None = None) -> str | None:
        """Why this holder is dead (a sentence), or None while it is alive."""
        now = time.time() if now is None else now
        if self.host == _host() and not pid_alive(self.pid, self.pid_start):
            return f"its process {self.pid} on this host is gone"
        if now > self.expires:
            return f"its lease expired {now - self.expires:.0f} s ago (last renewed {now - self.renewed:.0f} s ago)"
        return None


# Fields a later srl may add are ignored, so a newer holder's record never reads as unreadable (stale).
_RECORD = TypeAdapter(Holder)


def _host() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class _Slot:
    """One lease file: the run lease of a run, or the policy-owner lease of an inference deployment."""

    path: Path
    history: Path
    what: str  # "run <dir>" or "inference deployment <dir>"
    owner: bool  # a policy-owner lease (or a LoRA-tenant lease)
    tenant: bool = False  # a LoRA-tenant lease

    def refusal(self, holder: Holder) -> str:
        if not self.owner:
            return (
                f"{self.what} is being run by {holder.describe()}; stop it with: srl cancel "
                f"{self.path.parent.parent} (or wait for it to end)"
            )
        if self.tenant:
            return (
                f"{self.what} serves the LoRA adapter of run {holder.run} ({holder.describe()}); loading full "
                "weights would change the base model under that run's adapter (only LoRA runs, each with its "
                f"own adapter, may share a deployment). Stop that run (srl cancel {holder.run}) or give this run "
                "a deployment of its own"
            )
        return (
            f"{self.what} already serves the weights of run {holder.run} ({holder.describe()}); two runs loading "
            "their weights into one deployment would each train on rollouts of the other's policy. Stop that "
            f"run (srl cancel {holder.run}) or give this run a deployment of its own"
        )


def _run_slot(run: RunDir) -> _Slot:
    return _Slot(run.lease_file, run.lease_history, f"run {run.root}", owner=False)


def _owner_slot(deployment: RunDir) -> _Slot:
    return _Slot(
        deployment.policy_owner_file, deployment.lease_history, f"inference deployment {deployment.root}", owner=True
    )


def _tenant_slot(deployment: RunDir, run_id: str) -> _Slot:
    return _Slot(
        deployment.lora_tenants / f"{run_id}.json",
        deployment.lease_history,
        f"inference deployment {deployment.root}",
        owner=True,
        tenant=True,
    )


def read(run: RunDir) -> Holder | None:
    """The run's current lease record, or None when there is none. An unreadable or foreign-format file reads as
    a holder that expired long ago (it can be taken over)."""
    return _read(run.lease_file)


def read_policy_owner(deployment: RunDir) -> Holder | None:
    """The record of the run whose weights inference deployment ``deployment`` serves, or None."""
    return _read(deployment.policy_owner_file)


def live_lora_tenants(deployment: RunDir) -> list[Holder]:
    """The live records of the runs whose LoRA adapters inference deployment ``deployment`` serves."""
    try:
        paths = sorted(deployment.lora_tenants.glob("*.json"))
    except OSError:
        return []
    return [h for p in paths if (h := _read(p)) is not None and h.dead_reason() is None]


def deployment_refusal(deployment: RunDir, run: RunDir, *, lora: bool) -> str | None:
    """Why run ``run`` may not load its weights into inference deployment ``deployment`` now (None: it may):
    another live run owns its full weights, or, for a full-weight run (``lora`` false), another live run has its
    LoRA adapter there. A look only (the orchestrator takes the lease itself); for refusing early at launch."""
    owner = read_policy_owner(deployment)
    if owner is not None and owner.run != str(run.root) and owner.dead_reason() is None:
        return _owner_slot(deployment).refusal(owner)
    if not lora:
        for tenant in live_lora_tenants(deployment):
            if tenant.run != str(run.root):
                return _tenant_slot(deployment, "?").refusal(tenant)
    return None


def teacher_refusal(deployment: RunDir) -> str | None:
    """Why ``deployment`` cannot serve as a distillation teacher now (None: it can): a live run owns its weights
    and loads new ones into it, and a teacher must stay frozen. A look only (launch and orchestrator both ask)."""
    owner = read_policy_owner(deployment)
    if owner is None or owner.dead_reason() is not None:
        return None
    return (
        f"{deployment.root} serves the weights run {owner.run} trains (it loads new ones there); a teacher must "
        "stay frozen: serve it with a deployment of its own (srl inference)"
    )


def _read(path: Path) -> Holder | None:
    try:
        return _parse(path.read_bytes())
    except FileNotFoundError:
        return None


def _parse(raw: bytes) -> Holder:
    try:
        return _RECORD.validate_python(json.loads(raw))
    except ValueError:  # not JSON, or a record with a missing or mistyped field (pydantic's ValidationError)
        return Holder(
            token="?",
            host="?",
            pid=0,
            pid_start=None,
            job_id=None,
            command="an unreadable lease file",
            acquired=0.0,
            renewed=0.0,
            expires=0.0,
        )


class Lease:
    """A lease this process holds (on a run, or as a deployment's policy owner); renewed by a daemon thread until
    :meth:`release`."""

    def __init__(self, slot: _Slot, holder: Holder):
        self.slot = slot
        self.holder = holder
        self._stop = threading.Event()
        self._mutex = threading.Lock()  # a renewal never runs while the holder rewrites the record itself
        self._thread: threading.Thread | None = None
        self._on_lost: list[Callable[[str], None]] = []
        self.lost: str | None = None  # why the lease was lost, once it was

    @property
    def token(self) -> str:
        """The lease's token, handed to roles in ``SRL_RUN_LEASE``."""
        return self.holder.token

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (from the heartbeat thread) if the lease is ever taken from this process."""
        self._on_lost.append(callback)
        if self.lost is not None:
            callback(self.lost)

    def start(self) -> Lease:
        """Start renewing every ``RENEW_S`` seconds (idempotent). Returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="srl-lease", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                self.renew()
            except LeaseLost as e:
                self._lose(str(e))
                return
            except OSError as e:  # a filesystem hiccup: try again at the next beat; expiry bounds the damage
                log.warning("could not renew the lease %s: %s", self.slot.path, e)

    def _lose(self, reason: str) -> None:
        self.lost = reason
        print(f"srl: lost the lease of {self.slot.what}: {reason}", file=sys.stderr, flush=True)
        for cb in self._on_lost:
            cb(reason)

    def renew(self) -> None:
        """Push the expiry ``TTL_S`` seconds ahead. Raises LeaseLost when the record is no longer ours, OSError
        when the file cannot be written."""
        with self._mutex:
            # Checked before writing too: with the run directory deleted, writing would fail as a filesystem
            # error, which the renewal thread retries, instead of giving the lease up.
            cur = _read(self.slot.path)
            if cur is None:
                raise LeaseLost(f"{self.slot.path} was removed")
            if cur.token != self.token:
                raise LeaseLost(f"it is now held by {cur.describe()}")
            now = time.time()
            renewed = Holder(**{**asdict(self.holder), "renewed": now, "expires": now + TTL_S})
            if not _write(self.slot.path, renewed, create=False, replaces=self.token):
                cur = _read(self.slot.path)
                raise LeaseLost(f"it is now held by {cur.describe()}" if cur else f"{self.slot.path} was removed")
            self.holder = renewed

    @contextlib.contextmanager
    def emptying(self) -> Iterator[None]:
        """Around deleting the directory that holds the record (``--clean``): no renewal runs meanwhile (it would
        find the record gone and give the lease up), and the record is written again afterwards. Raises LeaseHeld
        when another launch created a lease in between."""
        with self._mutex:
            yield
            self.slot.path.parent.mkdir(parents=True, exist_ok=True)
            if not _write(self.slot.path, self.holder, create=True):
                cur = _read(self.slot.path)
                if cur is not None and cur.token != self.token:
                    raise LeaseHeld(self.slot, cur)

    def release(self) -> None:
        """Stop renewing and remove the record if it is still ours (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=RENEW_S + 1)
        _held.pop(self.slot.path, None)
        cur = _read(self.slot.path)
        if cur is not None and cur.token == self.token and self.lost is None:
            self.slot.path.unlink(missing_ok=True)


# The leases this process holds, by lease file: a launch acquires once (before it writes the run directory) and the
# supervisor it becomes keeps using that lease.
_held: dict[Path, Lease] = {}


def held(run: RunDir) -> Lease | None:
    """The lease this process holds on ``run``, if any."""
    return _held.get(run.lease_file)


def acquire(run: RunDir, *, command: str = "srl", job_id: str | None = None) -> Lease:
    """Take the run's lease for this process and start renewing it; return the one this process already holds.

    ``job_id``: this process's Slurm job id (default ``$SLURM_JOB_ID``); a record left by the same job (a requeued
    job's previous incarnation) is taken over even before it expires. A dead holder's record is taken over and the
    takeover printed and appended to ``launcher/lease_history.jsonl``. Raises :class:`LeaseHeld` naming a live
    holder; OSError when the run directory cannot be written.
    """
    return _acquire(_run_slot(run), run, command=command, job_id=job_id)


def acquire_policy_owner(deployment: RunDir, owner: RunDir, *, command: str, job_id: str | None = None) -> Lease:
    """Become the one run whose weights inference deployment ``deployment`` serves (``owner``: the run that will
    load its weights there), as :func:`acquire` does for a run. Raises :class:`LeaseHeld` naming the run that owns
    the deployment while it lives, or a live run whose LoRA adapter it serves (the record is then given back)."""
    lease = _acquire(_owner_slot(deployment), owner, command=command, job_id=job_id)
    others = [t for t in live_lora_tenants(deployment) if t.run != str(owner.root)]
    if others:
        lease.release()
        raise LeaseHeld(_tenant_slot(deployment, "?"), others[0])
    return lease


def acquire_lora_tenant(
    deployment: RunDir, owner: RunDir, run_id: str, *, command: str, job_id: str | None = None
) -> Lease:
    """Become one of the runs whose LoRA adapter inference deployment ``deployment`` serves (``owner``: the run,
    ``run_id`` its id, which names its adapter and its record). Other LoRA runs may hold theirs meanwhile. Raises
    :class:`LeaseHeld` naming a live run that loads full weights there (the record is then given back), or the
    live process of this same run that holds it."""
    lease = _acquire(_tenant_slot(deployment, run_id), owner, command=command, job_id=job_id)
    full = read_policy_owner(deployment)
    if full is not None and full.run != str(owner.root) and full.dead_reason() is None:
        lease.release()
        raise LeaseHeld(_owner_slot(deployment), full)
    return lease


def _acquire(slot: _Slot, run: RunDir, *, command: str, job_id: str | None) -> Lease:
    mine = _held.get(slot.path)
    if mine is not None:
        return mine
    job_id = job_id if job_id is not None else (os.environ.get("SLURM_JOB_ID") or None)
    now = time.time()
    me = Holder(
        token=uuid.uuid4().hex,
        host=_host(),
        pid=os.getpid(),
        pid_start=process_start_time(os.getpid()),
        job_id=job_id,
        command=command,
        acquired=now,
        renewed=now,
        expires=now + TTL_S,
        run=str(run.root),
    )
    slot.path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(8):
        if _write(slot.path, me, create=True):
            break
        try:
            raw = slot.path.read_bytes()
        except FileNotFoundError:
            continue  # released just now: try to create it again
        cur = _parse(raw)
        why = f"the same Slurm job {job_id} was requeued" if job_id and cur.job_id == job_id else cur.dead_reason()
        if why is None:
            raise LeaseHeld(slot, cur)
        if _take_over(slot, raw, cur, me, why):
            break
    else:
        raise LeaseHeld(slot, _read(slot.path) or me)  # kept losing races to other launches: one of them runs it
    lease = Lease(slot, me)
    _held[slot.path] = lease
    return lease.start()


def _take_over(slot: _Slot, raw: bytes, stale: Holder, me: Holder, why: str) -> bool:
    """Replace the stale record ``raw`` by ``me``'s; True when done. Exactly one racer can: the lease file is first
    linked to a claim named after ``raw``'s bytes, which only one link creates. False when another launch holds the
    claim (waited for, up to ``TTL_S``) or the file is gone; the caller then looks again. Raises LeaseHeld when the
    claimed file no longer holds ``raw`` (its holder renewed it, or a racer's fresh record replaced it)."""
    claim = slot.path.with_name(f".lease.{hashlib.sha256(raw).hexdigest()[:16]}.claim")
    try:
        os.link(slot.path, claim)
    except FileNotFoundError:
        return False
    except FileExistsError:
        _wait_for_claim(claim)
        return False
    try:
        got = claim.read_bytes()
        if got != raw:
            raise LeaseHeld(slot, _parse(got))
        _write(slot.path, me, create=False)
    finally:
        claim.unlink()
    kind = "the policy-owner lease" if slot.owner else "the run lease"
    print(f"srl: took over {kind} of {slot.what} from {stale.describe()}: {why}", file=sys.stderr, flush=True)
    try:
        append_jsonl(
            slot.history,
            {
                "time": time.time(),
                "event": "policy owner takeover" if slot.owner else "takeover",
                "reason": why,
                "from": asdict(stale),
                "to": asdict(me),
            },
        )
    except OSError as e:
        log.warning("could not record the lease takeover in %s: %s", slot.history, e)
    return True


def _wait_for_claim(claim: Path) -> None:
    """Wait while another launch holds ``claim`` (it replaces the record within milliseconds). A claim left for
    ``TTL_S`` belongs to a launch killed while holding it; it is removed, so that the stale record can be taken."""
    deadline = time.monotonic() + TTL_S
    while time.monotonic() < deadline:
        try:
            claim.stat()
        except FileNotFoundError:
            return
        time.sleep(0.02)
    print(f"srl: removing {claim}, a lease takeover claim left by a launch that was killed", file=sys.stderr)
    claim.unlink(missing_ok=True)


def _write(path: Path, holder: Holder, *, create: bool, replaces: str | None = None) -> bool:
    """Write ``holder`` to ``path`` through a temporary file. ``create``: only if ``path`` does not exist (returns
    False when it does), else replace it; ``replaces``: only if the record there still holds this token (returns
    False when it does not). Readers never see a partial record."""
    tmp = path.with_name(f".lease.{holder.token}.{uuid.uuid4().hex[:6]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(asdict(holder), f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    try:
        # Checked after the fsync, right before the replace: a record another launch wrote while this one was
        # being synced (which can take seconds on a loaded filesystem) must not be overwritten.
        if replaces is not None and getattr(_read(path), "token", None) != replaces:
            return False
        if create:
            os.link(tmp, path)  # atomic create-if-absent, also on NFS
        else:
            os.replace(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def release_all() -> None:
    """Release every lease this process holds (also run at interpreter exit)."""
    for lease in list(_held.values()):
        lease.release()


atexit.register(release_all)


def watch(run: RunDir, token: str, on_gone: Callable[[str], None]) -> threading.Thread:
    """Start a daemon thread that calls ``on_gone(reason)`` once, when the lease ``token`` of ``run`` is no longer
    valid: the record names another holder, was removed, or its holder is dead. Looks every ``WATCH_S``
    seconds. For roles: a process started under one supervisor must never write into a run
    that another attempt owns, nor run on without its supervisor. Returns the thread."""

    def _loop() -> None:
        while True:
            time.sleep(WATCH_S)
            try:
                cur = read(run)
            except OSError:
                continue
            if cur is None:
                reason = f"the run lease {run.lease_file} is gone (its supervisor ended)"
            elif cur.token != token:
                reason = f"the run now belongs to {cur.describe()}"
            else:
                dead = cur.dead_reason()
                if dead is None:
                    continue
                reason = f"the supervisor {cur.describe()} is dead: {dead}"
            on_gone(reason)
            return

    t = threading.Thread(target=_loop, name="srl-lease-watch", daemon=True)
    t.start()
    return t


def exit_when_lease_gone(run: RunDir, role: str) -> threading.Thread | None:
    """For a role's entry point: when started under a lease (``SRL_RUN_LEASE`` set), exit this process with
    status 3 as soon as that lease is no longer valid (see :func:`watch`), without writing anything more. Returns
    the watching thread, or None when the role runs without a lease (started by hand)."""
    token = os.environ.get(LEASE_ENV)
    if not token:
        return None

    def _gone(reason: str) -> None:
        print(f"srl {role}: stopping at once: {reason}", file=sys.stderr, flush=True)
        os._exit(3)

    return watch(run, token, _gone)
