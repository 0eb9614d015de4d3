"""The launcher of the compiled (numba) kernels: lazy numba, threads, fallback.

The kernels themselves live with their family (``cluster/_lloyd_numba.py``,
``decomposition/_gnmf_numba.py``, ``multisource/_gram_numba.py``,
``linear_model/_glm_numba.py``), as plain Python functions over NumPy arrays that
each family registers here by name (:func:`register`); this module knows no
algorithm. It jits a kernel on its first use, runs it over chunks of rows on the
package's thread pool (:func:`launch`), or once (:func:`call`), and turns a
compilation failure into :class:`CompiledUnavailable`, after which every caller
runs its NumPy code. The kernels' 8-lane vector helpers are :mod:`._simd`.

numba is optional and imported lazily, on the first call that wants a kernel, never
at ``import ilargi_sklearn``. Without numba, or with the environment variable
``ILARGI_SKLEARN_NO_NUMBA=1`` (read at every call, so tests can switch it),
:func:`numba_available` is False and the callers keep their NumPy code: the
compiled kernels are a fast path, never the only one. They take NumPy arrays only;
operators on another namespace (CuPy, ``array_api_strict``) never reach them.

Threads. A launch splits the rows into chunks, each with its own partial sums,
reduced in chunk order, so that the result does not depend on which thread ran
which chunk (it does, by rounding, on the number of chunks). The chunks run on a
small pool of Python threads (:class:`_Pool`) that call the serial, ``nogil``
kernels: the calling thread takes chunks too, helpers take the next chunk as they
come (dynamic scheduling), and idle helpers sleep on a queue. So a thread whose
core another process holds takes fewer chunks, and nothing spins between
launches. Not numba's parallel loops (``prange``): their OpenMP workers spin after
each loop, taking the cores from BLAS's threads and from other processes, and each
loop waits for its slowest thread (``benchmarks/README.md``, "Threads on a busy
machine").

How many threads (:func:`n_threads`): the smallest of scikit-learn's OpenMP count
(``OMP_NUM_THREADS``, ``threadpoolctl`` limits, the cores joblib counts), numba's
(``NUMBA_NUM_THREADS``, which joblib's loky workers set: inside
``GridSearchCV(n_jobs=2)`` on 2 cores each worker gets one thread) and the CPU
affinity mask of the process at the time of the call. A launch then takes only the
threads that get enough rows (:func:`chunks`, :data:`MIN_CHUNK_ROWS`, which each
kernel sets when it registers): a second thread pays only from a millisecond or two
of work per launch. Work that calls BLAS in parallel tasks (:func:`run_tasks`) runs
with BLAS on one thread (:func:`one_blas_thread`). Launches from several Python
threads at once (``GridSearchCV`` with a threading backend, Dask workers) share
the pool.

Compilation: ``cache=True`` writes the machine code next to the kernel's module (or
to numba's user cache directory when that is read-only), so only the first call on
a machine compiles (about a second per estimator). Before the first kernel
compiles, one INFO line says so (:data:`COMPILE_NOTICE`; numba's compile events
tell, so nothing is said when a kernel loads from the cache) and :func:`on_compile`
callbacks run; :func:`kernels_to_compile` tells beforehand which kernels are not in
the cache. A cache file that numba cannot read (truncated, overwritten) is emptied
and its kernel compiled again, with one warning per process, instead of failing
every call until someone deletes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "CHUNKS_PER_THREAD",
    "COMPILE_NOTICE",
    "MIN_CHUNK_ROWS",
    "NO_NUMBA_ENV",
    "U",
    "CompiledUnavailable",
    "base_arrays",
    "call",
    "chunks",
    "disable",
    "index_tuple",
    "kernels_to_compile",
    "launch",
    "n_threads",
    "numba_available",
    "on_compile",
    "one_blas_thread",
    "register",
    "run_tasks",
]

logger = logging.getLogger(__name__)

NO_NUMBA_ENV = "ILARGI_SKLEARN_NO_NUMBA"

_state: dict[str, Any] = {"numba": None, "kernels": {}, "compile_notice": False}
_kernels_lock = threading.Lock()

#: The registered kernel sources, by name (:func:`register`).
_SOURCES: dict[str, Callable[..., None]] = {}
#: Kernels jitted without FMA contraction (:func:`register`).
_NO_CONTRACT: set[str] = set()

#: The kernels index their arrays through this cast (``_u = U`` in their
#: modules). numba tests every signed index for a negative value (Python's wrap-around) unless LLVM proves it cannot be,
#: which it does not for a loop over ``range(start, stop)`` or a row read from an
#: index vector; an unsigned index has no test. Only indices known to be
#: non-negative are cast, and never mixed in arithmetic with signed integers (numba
#: would promote the result to float64); the unsigned loads run about twice as fast.
U = np.uint64


_import_lock = threading.Lock()


def _import_numba() -> Any:
    """The numba module, or False when it cannot be imported (cached)."""
    if _state["numba"] is None:
        with _import_lock:  # fits on several threads may get here at once
            if _state["numba"] is None:
                _state["numba"] = _first_import()
    return _state["numba"]


def _first_import() -> Any:
    try:
        import numba
    except Exception as exc:  # pragma: no cover - numba is in the test extra
        # Not installed, or installed but broken (e.g. against another NumPy).
        logger.info(
            "numba cannot be imported (%s): NumPy kernels are used "
            "(pip install numba for the compiled ones).",
            exc,
        )
        return False
    _listen_for_compiles(numba)
    return numba


#: Called with a kernel's name just before it compiles (:func:`on_compile`).
_compile_callbacks: list[Callable[[str], None]] = []


def _listen_for_compiles(numba: Any) -> None:
    """Register, once, a listener of numba's compile events (fired only when
    a dispatcher compiles, after its cache had no machine code to load)."""
    if _state.get("listening"):
        return
    _state["listening"] = True
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - numba >= 0.60 has the event API
        return

    class _Listener(event.Listener):
        def on_start(self, ev: Any) -> None:
            data = ev.data if isinstance(ev.data, dict) else {}
            func = getattr(data.get("dispatcher"), "py_func", None)
            for name, source in list(_SOURCES.items()):
                if source is func:
                    _compiling(name, data["dispatcher"])
                    return

        def on_end(self, ev: Any) -> None:
            pass

    event.register("numba:compile", _Listener())


def _compiling(name: str, dispatcher: Any) -> None:
    """Kernel ``name`` is about to compile: the notice (once), the callbacks."""
    if not _state["compile_notice"]:
        _state["compile_notice"] = True
        cache = getattr(dispatcher, "_cache", None)
        logger.info(COMPILE_NOTICE, getattr(cache, "_cache_path", "its directory"))
    for callback in list(_compile_callbacks):
        callback(name)


def on_compile(callback: Callable[[str], None]) -> Callable[[], None]:
    """Call ``callback(name)`` just before a kernel compiles (not when numba
    loads it from its cache), in the thread that compiles it.

    Returns
    -------
    remove : callable
        Takes the callback off again.
    """
    _compile_callbacks.append(callback)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _compile_callbacks.remove(callback)

    return remove


def numba_available() -> bool:
    """Whether the compiled kernels are used (numba importable and not disabled:
    by the ``compiled_kernels`` setting, :func:`~ilargi_sklearn.set_config`, or
    the environment variable)."""
    from ilargi_sklearn._config import get_config

    if os.environ.get(NO_NUMBA_ENV, "").strip() not in ("", "0"):
        return False
    if not get_config()["compiled_kernels"]:
        return False
    return bool(_import_numba())


def n_threads() -> int:
    """Threads the compiled kernels may use now (at least 1).

    The smallest of

    * scikit-learn's OpenMP count (``_openmp_effective_n_threads``):
      ``OMP_NUM_THREADS``, a ``threadpoolctl`` limit on the OpenMP libraries
      (``threadpool_limits(1)`` or ``threadpool_limits(1, user_api="openmp")``),
      else the physical cores that joblib counts (CPU affinity and cgroup quotas
      at its first call, ``LOKY_MAX_CPU_COUNT``);
    * numba's thread count: ``NUMBA_NUM_THREADS``, which joblib's loky workers
      set (``GridSearchCV(n_jobs=2)`` on 2 cores gives each worker one thread),
      and ``numba.set_num_threads`` where numba's own threading layer runs;
    * the CPUs this process may run on now (``os.sched_getaffinity``: ``taskset``,
      a container's cpuset), which joblib and libgomp read only once.

    A kernel launch then uses no more threads than it has chunks of work
    (:func:`chunks`). About 4 us per call.
    """
    numba = _import_numba()
    caps = []
    if numba:
        caps.append(int(numba.config.NUMBA_NUM_THREADS))
        # get_num_threads would start numba's threading layer (OpenMP workers that
        # spin): asked only where that layer already runs.
        if getattr(numba.np.ufunc.parallel, "_is_initialized", False):
            caps.append(int(numba.get_num_threads()))
    caps.append(_openmp_threads())
    try:
        caps.append(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        pass
    return max(1, min(caps))


def _openmp_threads() -> int:
    """scikit-learn's thread count for its OpenMP code."""
    try:
        from sklearn.utils._openmp_helpers import _openmp_effective_n_threads
    except ImportError:  # pragma: no cover - private helper of scikit-learn
        return os.cpu_count() or 1
    return int(_openmp_effective_n_threads())


class _Launch:
    """The chunks of one launch, handed out one at a time to whichever thread asks.

    Chunk ``c`` runs ``task(c)`` exactly once; ``wait`` returns when every chunk
    handed out has finished, and raises the first exception of any of them (no
    chunk is handed out after it).
    """

    def __init__(self, task: Callable[[int], None], n_chunks: int) -> None:
        self.task = task
        self.n_chunks = n_chunks
        self.handed = 0
        self.finished = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()

    def work(self) -> None:
        while True:
            with self.lock:
                c = self.handed
                if c >= self.n_chunks:
                    return
                self.handed = c + 1
            try:
                self.task(c)
            except BaseException as exc:  # re-raised by wait, in the caller
                with self.lock:
                    if self.error is None:
                        self.error = exc
                    self.n_chunks = self.handed
            with self.lock:
                self.finished += 1
                last = self.finished == self.handed >= self.n_chunks
            if last:
                self.done.release()

    def wait(self) -> None:
        self.done.acquire()
        if self.error is not None:
            raise self.error


class _Pool:
    """Helper threads for the kernels' launches, started on first use.

    The calling thread runs chunks too, and helpers take chunks as they come
    (dynamic scheduling): a helper that the OS has not scheduled yet (its core
    taken by another process) takes no chunk, and the launch does not wait for it.
    Idle helpers block on a queue (no spinning), so between launches they leave
    the cores to BLAS, NumPy and other processes. Launches from several Python
    threads at once share the helpers.
    """

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A forked child has none of the parent's threads (and a lock that
            # one of them held would stay held).
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._n_helpers = 0

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        while True:
            jobs.get().work()

    def run(self, task: Callable[[int], None], n_chunks: int, threads: int) -> None:
        """``task(c)`` for ``c`` in ``range(n_chunks)`` on up to ``threads`` threads."""
        helpers = min(threads, n_chunks) - 1
        if helpers <= 0:
            for c in range(n_chunks):
                task(c)
            return
        with self._lock:
            for i in range(self._n_helpers, helpers):
                threading.Thread(
                    target=self._serve,
                    args=(self._queue,),
                    name=f"ilargi-kernels-{i}",
                    daemon=True,
                ).start()
            self._n_helpers = max(self._n_helpers, helpers)
            jobs = self._queue
        launch = _Launch(task, n_chunks)
        for _ in range(helpers):
            jobs.put(launch)
        launch.work()
        launch.wait()


_pool = _Pool()

_blas: dict[str, Any] = {"controller": None, "limiter": None, "users": 0}
_blas_lock = threading.Lock()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread inside the block (for every thread of the process).

    For code that calls BLAS on vectors and thin blocks many times: level-1 BLAS
    in L-BFGS-B on ten thousand parameters, the products of the kernels' tasks
    (:func:`run_tasks`). Multi-threaded, such calls spend more on waking and
    waiting for BLAS's threads than they save (a logistic fit on Hamlet's
    Flights: 0.69 s with two OpenBLAS threads, 0.31 s with one), and BLAS threads
    that spin-wait collapse when another process holds a core. As scikit-learn's
    KMeans does around its Lloyd iterations; nested and concurrent uses count, and
    the last to leave restores BLAS's thread counts.
    """
    with _blas_lock:
        if _blas["users"] == 0:
            # One controller, made once (threadpoolctl scans the loaded libraries:
            # about 1 ms); setting the limit costs microseconds.
            if _blas["controller"] is None:
                from threadpoolctl import ThreadpoolController

                _blas["controller"] = ThreadpoolController()
            _blas["limiter"] = _blas["controller"].limit(limits=1, user_api="blas")
        _blas["users"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas["users"] -= 1
            if _blas["users"] == 0:
                _blas["limiter"].restore_original_limits()


def run_tasks(task: Callable[[int], None], n_tasks: int, threads: int) -> None:
    """``task(t)`` for ``t`` in ``range(n_tasks)`` on up to ``threads`` threads of
    the kernels' pool (the calling thread among them), BLAS on one thread
    meanwhile (:func:`one_blas_thread`: each task's BLAS calls would otherwise
    start BLAS's own threads, more threads than cores).

    NumPy's ufuncs, BLAS and the compiled kernels release the GIL, so tasks made
    of them run in parallel; a task should write to its own slot of the results,
    summed in task order, so that they do not depend on the scheduling.
    """
    if min(threads, n_tasks) <= 1:
        _pool.run(task, n_tasks, 1)
        return
    with one_blas_thread():
        _pool.run(task, n_tasks, threads)


def run_kernel_tasks(task: Callable[[int], None], n_tasks: int, threads: int) -> None:
    """:func:`run_tasks` for tasks that call compiled kernels only (no BLAS):
    BLAS's thread counts are left as they are, since setting and restoring the
    limit costs about 25 us a call, as much as a tenth of a fused product on a
    mid-sized dataset."""
    _pool.run(task, n_tasks, threads if n_tasks > 1 else 1)


def register(
    name: str,
    source: Callable[..., None],
    *,
    min_rows: int | None = None,
    contract: bool = True,
) -> None:
    """Register the kernel ``name``: a plain Python function over NumPy arrays,
    jitted on its first use (a chunked one takes ``c, start, stop`` last, see
    :func:`launch`). ``min_rows``: the fewest rows of a chunk worth handing to a
    thread (:data:`MIN_CHUNK_ROWS`). ``contract=False``: no ``a * b + c``
    contracted into one FMA, for a kernel whose results must round as its
    NumPy reference's do (where a last-bit difference can flip a tie)."""
    _SOURCES[name] = source
    if not contract:
        _NO_CONTRACT.add(name)
    if min_rows is not None:
        MIN_CHUNK_ROWS[name] = int(min_rows)


def _dispatcher(name: str) -> Any:
    """The jitted kernel ``name``: a numba dispatcher, made on first use (it
    compiles, or loads from numba's cache, at its first call per signature)."""
    kernels = _state["kernels"]
    fn = kernels.get(name)
    if fn is None:
        numba = _import_numba()
        with _kernels_lock:
            fn = kernels.get(name)
            if fn is None:
                fn = kernels[name] = _jit(
                    numba, _SOURCES[name], cache=True, contract=name not in _NO_CONTRACT
                )
    return fn


def _jit(
    numba: Any, source: Callable[..., None], *, cache: bool, contract: bool = True
) -> Any:
    """A numba dispatcher of ``source`` with the kernels' options."""
    # Contracting a * b + c into one FMA (as BLAS does), and NumPy's error model
    # (no ZeroDivisionError test on every float division), which lets a loop that
    # divides vectorize.
    return numba.njit(
        cache=cache,
        nogil=True,
        fastmath={"contract"} if contract else False,
        error_model="numpy",
    )(source)


def _kernel(name: str) -> Any:
    """The jitted kernel ``name``. When a call compiles it (numba's cache holds
    no machine code for its arguments), the one-time :data:`COMPILE_NOTICE` and
    the :func:`on_compile` callbacks come first."""
    return _dispatcher(name)


#: The INFO message logged once per process, before the first kernel compiles.
COMPILE_NOTICE = (
    "Compiling ilargi_sklearn's numba kernels for this machine: once, about a "
    "second per estimator; later runs load them from numba's cache (%s)."
)


def _cached(fn: Any) -> bool:
    """Whether numba's cache holds machine code of the jitted ``fn`` for this
    source, numba version and CPU (then a call loads it instead of compiling)."""
    try:
        from numba.core.registry import cpu_target

        magic = cpu_target.target_context.codegen().magic_tuple()
        index = fn._cache._cache_file._load_index()
    except Exception:  # pragma: no cover - numba internals moved: assume not
        return False
    return any(key[1] == magic for key in index)


def kernels_to_compile() -> list[str]:
    """The compiled kernels that numba's cache holds no machine code for.

    Empty when every kernel was compiled on this machine before (for this version
    of the package and of numba) and is loaded from the cache, and when the
    compiled kernels are not used (:func:`numba_available` False). A fit compiles
    the kernels it uses that are listed here, once per machine (about a second per
    estimator); the first one also logs
    :data:`COMPILE_NOTICE` at INFO on this module's logger. Cheap (reads the
    cache's index files; imports numba).

    Returns
    -------
    list of str
        Kernel names, sorted.
    """
    if not numba_available():
        return []
    return sorted(
        name
        for name in _SOURCES
        if not _dispatcher(name).signatures and not _cached(_dispatcher(name))
    )


def uniform_tuple(arrays) -> tuple:
    """The arrays as a tuple numba types as one (homogeneous) tuple.

    numba types a read-only array apart from a writable one, and cannot index a
    tuple that mixes them: arrays memory-mapped read-only (joblib's workers, a
    user's ``np.load(mmap_mode="r")``) next to writable ones would fail to
    compile. The kernels only read these, so where any is read-only all become
    read-only views (no copy); all writable stay as they are.
    """
    arrays = tuple(arrays)
    if all(a.flags.writeable for a in arrays):
        return arrays
    views = []
    for a in arrays:
        v = a.view()
        v.flags.writeable = False
        views.append(v)
    return tuple(views)


def index_tuple(idxs: list[np.ndarray], n_rows: int) -> tuple[tuple, int]:
    """The index vectors as a homogeneous tuple (one dummy vector when empty)."""
    if not idxs:
        return (np.zeros(n_rows, dtype=np.int64),), 0
    tup = uniform_tuple(np.ascontiguousarray(i, dtype=np.int64) for i in idxs)
    return tup, len(idxs)


def base_arrays(X0: Any, o0: np.ndarray) -> tuple:
    """``(dense X0, indptr, indices, data)`` of the identity source for the kernels.

    A dense ``X0`` comes without a CSR part (None: numba compiles a specialization
    without the CSR loop, faster than one reading an empty CSR part), a CSR
    ``X0`` with an ``n x 0`` dense part: one kernel source reads both.
    """
    if not sp.issparse(X0):
        return X0, None, None, None
    if o0.shape[0] and np.any(o0 != 0):
        nonzero = np.flatnonzero(o0 != 0)
        raise ValueError(
            "a sparse X0 cannot be centered inside the kernels: o0 must be zero, "
            f"got nonzero offsets at columns {nonzero[:5].tolist()}."
        )
    if X0.format != "csr":
        raise ValueError(f"a sparse X0 must be in CSR format, got {X0.format!r}.")
    n = X0.shape[0]
    return np.empty((n, 0), dtype=X0.dtype), X0.indptr, X0.indices, X0.data


class CompiledUnavailable(RuntimeError):
    """A kernel failed to compile here: the compiled kernels are now disabled.

    Callers catch it and run their NumPy code instead (the results are the same).
    """


def disable(reason: str) -> CompiledUnavailable:
    """Disable the compiled kernels for the process, with one warning; returns
    the :class:`CompiledUnavailable` for the caller to raise."""
    _state["numba"] = False
    logger.warning("%s; the NumPy kernels are used from now on.", reason)
    return CompiledUnavailable(reason)


def _run(name: str, body: Callable[[Any], None]) -> None:
    """``body(kernel)`` with kernel ``name``; a compilation failure (numba installed
    but unable to compile on this platform) disables the compiled kernels for the
    process, with one warning, and raises :class:`CompiledUnavailable`.

    A damaged cache file of the kernel (truncated, overwritten: numba's loader
    raises whatever its unpickling meets) is emptied and the kernel compiled
    again (:func:`_recompile`), with one warning per process; nothing of the
    kernel ran before a load fails, so ``body`` simply runs again."""
    for attempt in range(2):
        try:
            body(_kernel(name))
            return
        except Exception as exc:
            # A task on another thread may have disabled the kernels meanwhile
            # (its own compile failure): this one's is then no less a compile
            # failure, reported as one (without a second warning).
            numba = _state["numba"] or sys.modules.get("numba")
            if not numba:
                raise
            if isinstance(exc, numba.core.errors.NumbaError):
                reason = f"numba could not compile the {name!r} kernel ({exc})"
                if _state["numba"] is False:
                    raise CompiledUnavailable(reason) from exc
                raise disable(reason) from exc
            if attempt or not _raised_by_cache(exc):
                raise
            _recompile(name, exc)


def _raised_by_cache(exc: BaseException) -> bool:
    """Whether ``exc`` comes from numba's on-disk cache (loading machine code)."""
    tb = exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if path.endswith("numba/core/caching.py"):
            return True
        tb = tb.tb_next
    return False


def _recompile(name: str, exc: BaseException) -> None:
    """Replace kernel ``name``, whose cache could not be read, by a new dispatcher.

    The damaged index is overwritten by an empty one (numba's ``flush``), so the
    new dispatcher compiles and saves the kernel afresh and later processes load
    it again; where the cache cannot be written, the kernel is compiled in memory
    only. One warning per process (later ones are logged at INFO).
    """
    numba = _state["numba"]
    old = _state["kernels"].get(name)
    cache = getattr(old, "_cache", None)
    where = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    try:
        cache.flush()
        writable = True
    except Exception:  # noqa: BLE001 - read-only cache: compile in memory
        writable = False
    with _kernels_lock:
        _state["kernels"][name] = _jit(
            numba, _SOURCES[name], cache=writable, contract=name not in _NO_CONTRACT
        )
    message = (
        f"numba's cache of the compiled {name!r} kernel ({where or 'its cache folder'})"
        f" could not be read ({type(exc).__name__}: {exc}): the kernel is compiled "
        + ("again and its cache rewritten." if writable else "again, in memory.")
    )
    if _state.get("cache_warned"):
        logger.info(message)
        return
    _state["cache_warned"] = True
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def call(name: str, *args: Any) -> None:
    """Run kernel ``name`` once, on the calling thread: ``kernel(*args)``."""
    _run(name, lambda kernel: kernel(*args))


def launch(name: str, head: tuple, n: int, n_chunks: int, threads: int) -> None:
    """Run kernel ``name`` over rows ``[0, n)`` in ``n_chunks`` chunks of equal
    length, on up to ``threads`` threads (:class:`_Pool`).

    Chunk ``c`` runs ``kernel(*head, c, start, stop)``; whatever a chunk sums goes
    to its own slot ``c`` of the output, so the result does not depend on which
    thread ran which chunk (it does, by rounding, on ``n_chunks``).
    """
    step = -(-n // n_chunks)

    def body(kernel: Any) -> None:
        def task(c: int) -> None:
            kernel(*head, c, c * step, min(n, (c + 1) * step))

        _pool.run(task, n_chunks, threads)

    _run(name, body)


#: Chunks per thread of a launch whose chunks sum into no per-chunk buffers: a
#: thread whose core is shared with another process takes fewer of them.
CHUNKS_PER_THREAD = 4

#: The fewest rows of a chunk, per kernel (:func:`chunks`), set by :func:`register`;
#: kernels with per-chunk sums raise it with the size of those sums.
MIN_CHUNK_ROWS: dict[str, int] = {}


def chunks(
    n: int,
    min_rows: int,
    threads: int | None = None,
    per_thread: int = CHUNKS_PER_THREAD,
) -> int:
    """Chunks of a launch over ``n`` rows on up to ``threads`` threads
    (:func:`n_threads` when None): ``per_thread`` chunks per thread, each of at
    least ``min_rows`` rows, on as many threads as have that much work; one chunk
    (no partial sums to reduce) when that is one thread.

    ``min_rows`` is where a chunk pays for handing it out and for its partial
    sums, and a thread must get ``per_thread`` such chunks: a second thread pays
    only from 1-2 ms of work per launch and thread, about 130,000 rows for the
    kernels here (``benchmarks/README.md``, "Threads on a busy machine")."""
    threads = n_threads() if threads is None else threads
    used = min(threads, n // (min_rows * per_thread))
    return per_thread * used if used > 1 else 1
