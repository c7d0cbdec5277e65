"""vLLM worker extension for faster live weight reloads (``--worker-extension-cls``, vLLM's RLHF mechanism).

vLLM mixes :class:`SrlWorkerExtension` into its worker class inside the engine's worker process; its methods are
then callable through ``POST /collective_rpc`` by name. Elsewhere (the weight updater, login-node code) only
its constants are used: torch and vllm are imported inside the methods, never at module level.

:meth:`SrlWorkerExtension.srl_reload_weights` runs vLLM's own in-place reload (``reload_weights`` with the
broadcast directory: same layerwise loading, same fused qkv/gate_up loaders, same LoRA base-layer handling), plus
what cuts its cost on the CPU backend (measured with tests/benchmarks/weight_sync.py, a 487 MB fp32 model on a
2-core host), and an optional per-phase profile:

- **Freed memory is kept in the process** (glibc ``mallopt``): on CPU every linear layer's weight is re-packed
  into oneDNN's blocked layout after loading (``UnquantizedLinearMethod.process_weights_after_loading`` ->
  ``create_onednn_mm``), and the layerwise reload allocates a fresh unpacked tensor per layer first. With glibc's
  defaults, allocations above the dynamic mmap threshold (at most 32 MiB, e.g. a gate_up projection) are fresh
  ``mmap`` s and freed ones go back to the kernel, so every reload page-faults (and zeroes) the whole model twice.
  Raising ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` lets each reload reuse the memory the previous layer and the
  previous version freed: the re-pack of the benchmark model fell from ~0.6 s to ~0.3 s. The cost is that the
  worker's resident memory stays at its high-water mark (model + one layer's temporaries) instead of shrinking.
- **The files are read ahead on another core** (:class:`_ReadAhead`): vLLM's loaders fault the memory-mapped files
  in page by page, and on CPU the worker's thread is pinned to its OpenMP core (``VLLM_CPU_OMP_THREADS_BIND``;
  vLLM's automatic binding leaves a core for the API server, idle while the engine is paused for the reload), so
  reads, copies and re-packing took turns on one core. A thread moved to the cores the worker does not use reads
  the files sequentially into the page cache while the loaders copy and re-pack: STABLE -> serving 1.34-1.37 s ->
  0.72-0.94 s (medians of 6-8 updates, 487 MB, tests/benchmarks/weight_sync.py). The same read ahead on the worker's own
  core (the thread inherits its pin) gained nothing, nor did ``posix_fadvise(WILLNEED)`` from the other core (1.04-1.12
  s: the kernel's readahead submits the reads, but the worker still waits for most of them) or vLLM's
  ``--safetensors-load-strategy prefetch``.

Why not ``model.load_weights`` directly (skipping ``reload_weights``): on CPU the packed layers hold an empty
``weight`` (``dispatch_cpu_unquantized_gemm(remove_weight=True)``) and compute from the oneDNN handle, so the
checkpoint-format loaders have nowhere to copy into; the re-pack after loading is what makes new weights served.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import functools
import importlib
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

# the --worker-extension-cls value (toolkit.engines.commands.WORKER_EXTENSION_CLS, the same text: the engine's
# worker imports this module alone, and tests/unit/test_inference_worker_ext.py checks the two agree)
EXTENSION_CLS = "toolkit.inference.worker_ext.SrlWorkerExtension"
RELOAD_METHOD = "srl_reload_weights"  # the /collective_rpc method name
IN_FLIGHT_METHOD = "srl_in_flight"  # the /collective_rpc method that lists what the worker is generating
RESULT_MARKER = "srl_reload"  # key every srl_reload_weights result carries (value: EXTENSION_API_VERSION)
EXTENSION_API_VERSION = 1

# glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Allocations up to this size come from the heap (reusable after free) instead of a fresh mmap; bytes. Above the
# largest single weight of models served on CPU here (a 8192 x 1024 fp32 gate_up is 32 MiB).
_MMAP_THRESHOLD_BYTES = 1 << 30
_TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # int max: never return freed heap top to the kernel


@functools.cache
def keep_freed_memory() -> bool:
    """Make this process's glibc malloc keep freed memory for reuse (see the module doc); idempotent (the first
    answer is kept; setting the same thresholds again would change nothing).

    Returns True when both ``mallopt`` calls succeeded, False where there is no glibc (musl, macOS) or it refused.
    Raises nothing.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1
    return ok_mmap and ok_trim


def _natural_key(path: Path) -> list:
    """Sort key putting ``model-00002-of-00010`` before ``model-00010-of-00010`` (vLLM reads shards in this order)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def weight_files(weights_path: str | Path) -> list[Path]:
    """The ``*.safetensors`` files of a HF weights directory, in vLLM's reading order. Raises FileNotFoundError
    when the directory holds none (vLLM would otherwise fall back to other formats or fail less clearly)."""
    files = sorted(Path(weights_path).glob("*.safetensors"), key=_natural_key)
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {weights_path}")
    return files


class _PhaseTimer:
    """Accumulates wall seconds spent inside named vLLM functions while installed (profile mode only).

    Wraps module attributes by name and restores them on exit; names absent in this vLLM version are skipped, so
    the profile degrades to fewer phases instead of failing the reload.
    """

    # (module, attribute, phase). dispatch_cpu_unquantized_gemm is the CPU re-pack (oneDNN / sgl), imported by
    # linear.py at call time, so the module attribute is what it calls.
    TARGETS = (
        ("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm", "repack"),
        ("vllm.model_executor.model_loader.reload.layerwise", "materialize_layer", "allocate"),
        ("vllm.model_executor.model_loader.reload.layerwise", "get_numel_loaded", "count_loaded"),
        ("vllm.model_executor.model_loader.reload.layerwise", "_layerwise_process", "layer_process"),
        ("vllm.model_executor.model_loader.reload.layerwise", "initialize_layerwise_reload", "initialize"),
        ("vllm.model_executor.model_loader.reload.layerwise", "finalize_layerwise_processing", "finalize"),
    )

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> _PhaseTimer:  # noqa: PYI034 - Python 3.10 has no typing.Self
        for module_name, attr, phase in self.TARGETS:
            try:
                module = importlib.import_module(module_name)
                original = getattr(module, attr)
            except (ImportError, AttributeError):
                continue
            self._saved.append((module, attr, original))
            setattr(module, attr, self._timed(original, phase))
        return self

    def _timed(self, fn, phase: str):
        seconds = self.seconds

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[phase] += time.perf_counter() - t0

        return timed

    def __exit__(self, *exc) -> None:
        for module, attr, original in reversed(self._saved):
            setattr(module, attr, original)
        self._saved.clear()

    def phases(self, total_s: float) -> dict[str, float]:
        """Exclusive seconds per phase: ``load_copy`` = loaders copying checkpoint tensors into the fresh layer
        tensors (includes page faults on the files), ``other`` = the rest of ``reload_weights`` (safetensors
        headers, name mapping, Python)."""
        s = dict(self.seconds)
        out = {k: s.get(k, 0.0) for k in ("repack", "allocate", "count_loaded", "initialize", "finalize")}
        if "layer_process" in s:
            out["load_copy"] = max(0.0, s["layer_process"] - out["repack"] - out["allocate"])
        out["other"] = max(0.0, total_s - sum(out.values()))
        return out


class _ReadAhead:
    """Reads ``files`` sequentially into the page cache from a background thread, on the CPUs this process was given
    (its parent's affinity, :meth:`cpus_of`) but the calling thread is not pinned to; where there are none (a process
    given one CPU) it stays on the calling thread's CPUs. See the module doc for why.

    Advisory only, and never the reason a reload fails or hangs: it raises nothing; a file that vanishes or cannot
    be read ends the read ahead silently (vLLM's own read then reports the error); anything that is not a regular
    file (a directory, a FIFO, a device such as ``/dev/zero`` behind a ``*.safetensors`` name) is skipped without
    blocking on it; each file is read up to its size at open. When no thread can be started there is no read
    ahead. ``join`` waits for the thread (by then vLLM has read the files, so the rest comes from the cache).
    """

    CHUNK = 16 << 20  # bytes per read call (dd bs=16M)

    @staticmethod
    def cpus_of(pid: int) -> set[int]:
        """The CPUs thread/process ``pid`` may run on (0: the calling thread); empty where it cannot be read.

        The read ahead uses the parent's minus the calling thread's. Why the parent's for "the CPUs given to this
        process": the calling thread's own mask is pinned before this code runs. vLLM's CPU worker sets
        ``OMP_PLACES``/``OMP_PROC_BIND`` for its process, and libgomp pins the main thread to the first place as
        soon as torch is imported (measured: ``{0, 1}`` -> ``{0}`` at ``import torch``). The parent (vLLM's engine
        core, or its API server when the worker runs in-process) is not pinned and shares the allocation: a
        ``taskset`` or Slurm affinity mask applies to the whole process tree. A cgroup cpuset needs no check here:
        the kernel confines ``sched_setaffinity`` to it."""
        try:
            return set(os.sched_getaffinity(pid))
        except (OSError, AttributeError):
            return set()

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.cpus = self.cpus_of(os.getppid()) - self.cpus_of(0)
        self.bytes_read = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="srl-read-ahead", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # "can't start new thread" (a thread or memory limit): the reload goes on without it
            self._thread = None

    def _run(self) -> None:
        if self.cpus:
            # pid 0 = this thread on Linux; a cpuset (Slurm cgroup) may refuse the others: then stay put
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.cpus)
        buf = memoryview(bytearray(self.CHUNK))
        try:
            for f in self.files:
                # O_NONBLOCK: opening a FIFO must not wait for a writer (no effect on regular files).
                fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    left = st.st_size  # a file still growing is read to its size at open, never without end
                    while left > 0 and not self._stop.is_set():
                        n = os.readv(fd, [buf[: min(self.CHUNK, left)]])
                        if not n:  # truncated meanwhile
                            break
                        self.bytes_read += n
                        left -= n
                finally:
                    os.close(fd)
        except (OSError, ValueError):
            return

    def stop(self) -> None:
        """Stop reading after the current chunk (the reload failed: nobody will read the rest)."""
        self._stop.set()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def _on_cpu() -> bool:
    """Whether this vLLM process runs the CPU backend (vLLM's platform detection); False when it cannot tell."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - an older/newer vLLM without this API: do not change malloc behaviour
        return False


class SrlWorkerExtension:
    """Methods vLLM adds to its worker class (``--worker-extension-cls toolkit.inference.worker_ext.
    SrlWorkerExtension``); ``self`` is the vLLM worker (``reload_weights``, ``model_runner``, ...)."""

    def srl_reload_weights(self, weights_path: str, profile: bool = False) -> dict[str, Any]:
        """Reload the HF safetensors directory ``weights_path`` in place (vLLM's ``reload_weights``), with freed
        memory kept for reuse on the CPU backend (module doc).

        Returns a JSON-able dict: ``srl_reload`` (EXTENSION_API_VERSION, proof the extension ran), ``seconds``
        (wall time in this worker), ``bytes`` (size of the files), ``reuse_memory`` (whether mallopt took effect),
        ``read_ahead_cpus`` (the cores the files were read ahead on; empty: the worker's own), ``worker_cpus``
        (the cores the calling thread may run on: one when vLLM pinned its worker, the engine's cores when the model
        runs in the engine core) and, with ``profile``, ``phases``: seconds per phase (repack, allocate, load_copy,
        count_loaded, initialize, finalize, other).
        A directory without safetensors files is answered with ``error`` (the engine stays up, on the old
        weights); vLLM's errors during the reload propagate, which makes vLLM stop the engine (weights half
        replaced must not be served).
        """
        t0 = time.perf_counter()
        try:
            if not isinstance(weights_path, (str, Path)):  # e.g. a JSON number or list sent to /collective_rpc
                raise TypeError(f"weights_path must be a directory path string, got {type(weights_path).__name__}")
            files = weight_files(weights_path)
        except (OSError, TypeError, ValueError) as exc:
            # Answered, not raised: vLLM treats any exception in a collective_rpc method as fatal and kills the
            # engine; nothing has been touched yet, so the engine keeps serving the old weights and the caller
            # (WeightUpdater) raises on this answer.
            return {RESULT_MARKER: EXTENSION_API_VERSION, "error": f"{type(exc).__name__}: {exc}"}
        # Only the CPU backend re-packs weights in host memory after loading; a GPU worker gains nothing from
        # keeping freed host memory and would only hold its high-water mark.
        reused = keep_freed_memory() if _on_cpu() else False
        timer = _PhaseTimer() if profile else None
        with timer if timer is not None else contextlib.nullcontext():
            ahead = _ReadAhead(files)
            try:
                self.reload_weights(weights_path=str(weights_path))  # type: ignore[attr-defined]
            except BaseException:
                ahead.stop()  # a failed reload must not wait for the read ahead of files nobody will read
                raise
            finally:
                ahead.join()
        seconds = time.perf_counter() - t0
        out: dict[str, Any] = {
            RESULT_MARKER: EXTENSION_API_VERSION,
            "seconds": seconds,
            "bytes": sum(f.stat().st_size for f in files),
            "reuse_memory": reused,
            "read_ahead_cpus": sorted(ahead.cpus),
            "worker_cpus": sorted(_ReadAhead.cpus_of(0)),
        }
        if timer is not None:
            out["phases"] = timer.phases(seconds)
        return out

    def srl_in_flight(self) -> dict[str, Any]:
        """The requests this worker's model runner holds and how far each has got: a diagnostic read of the
        engine's own state, exact while the engine is paused (no step runs between the read and the reload).

        Returns a JSON-able dict: ``srl_reload`` (EXTENSION_API_VERSION) and ``output_tokens``: for each request
        in the runner's table, the number of tokens sampled so far, ascending (a list of ints; a request that
        finished in the last step before a pause is still listed, with its full length). A model runner without a
        request table (another vLLM runner) is answered with ``error``; raises nothing (an exception in a
        collective_rpc method would stop the engine).

        Why it exists: an API server on a loaded host can stream a request's tokens seconds behind the engine, so a
        client cannot tell from its streams whether a request is still running when it asks for a weight update;
        the engine can.
        """
        requests = getattr(getattr(self, "model_runner", None), "requests", None)
        if not isinstance(requests, dict):
            return {RESULT_MARKER: EXTENSION_API_VERSION, "error": "this vLLM model runner keeps no request table"}
        counts = sorted(len(getattr(state, "output_token_ids", None) or ()) for state in list(requests.values()))
        return {RESULT_MARKER: EXTENSION_API_VERSION, "output_tokens": counts}
