"""Compiled (numba) row kernels for the NumPy fast paths, numba being optional.

The k-means iteration over a factorized matrix spent its time in passes over the
target rows: the factorized ``T C^T`` (one ``np.take`` and one add per row group,
through an ``n x k`` array), a row-wise ``argmin`` over a short last axis (about 3 ns
per element in NumPy) and a one-hot scatter for the M-step. The kernels here make one
pass over the index vectors of all row groups for the E-step (multiply the identity
source, add one precomputed table row per group, arg-min, all in registers) and one
for the M-step sums, with no ``n x k`` array at all. The identity source may be
dense or CSR: one kernel source reads both (a dense one comes without CSR arrays,
``None``, for which numba drops the CSR loop; a CSR one's dense part has no
columns), so the loops are not written twice.

The E-step holds a block of 8 centers in one 8-lane vector, through small LLVM
intrinsics (``_define_vector_ops``): numba keeps LLVM's SLP vectorizer off, and the
scalar form (eight accumulators, a 7-compare tournament) ran 4.4 ms per pass over
2e5 rows, 5 base columns and two 1e4-row tables, k=8, against 3.4 ms vectorized
(one thread), with bitwise the same labels and partial distances, 2.8-3.0 ms
with the accumulator in a register (``_acc8``) and selects for unmatched rows, and
1.6 ms with four rows per step (one row's chain of dependent FMAs, adds and its
arg-min had left the CPU waiting: about 43 cycles per row). Software prefetching of
the table rows 16 rows ahead and tiles of 128-512 rows (the table reads in a
separate loop per group) were measured too: no consistent gain.

A fused gather-add for the plain products ``T @ x`` (1 to 16 columns) was measured
too and is *not* used: on 2e5 target rows and two dimension tables it took 1.6 ms
(one column) and 4.0 ms (eight) against 0.9 ms and 2.8 ms for NumPy's ``take`` plus
add, which are already SIMD loops.

GNMF's multiplicative W update (:func:`mu_update`) tests, replaces, divides and
multiplies a row block in one loop, with NumPy's operations in NumPy's order. For 8
to 16 components and a dense float64 base, :func:`mu_rows` does the whole row update
in registers instead: the numerator (the base's product, one table row per group),
the denominator ``W_i H H^T`` and the update, four rows per step through the same
8-lane intrinsics, then the block's ``W^T W`` in 24 register accumulators. Those
were three small GEMMs per block (inner dimensions 5 and 10, or a 10 x 10 result,
shapes BLAS runs far from its peak), the gathers and the element-wise step, each a
pass over a block in memory; a GNMF fit (2e5 rows, two 1e4-row tables, 15 columns,
k = 10, 20 iterations, one thread) went from 281-289 to 185 ms.

numba is imported lazily, on the first call that wants a kernel, never at
``import ilargi_sklearn``. Without numba, or with the environment variable
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
launches. Not numba's parallel loops (``prange``): their OpenMP workers spin for
milliseconds after each loop, taking the cores from BLAS's threads and from other
processes, and each loop waits for its slowest thread; beside one CPU-bound
process the kernels' short launches collapsed (``benchmarks/README.md``, "Threads
on a busy machine").

How many threads (:func:`n_threads`): the smallest of scikit-learn's OpenMP count
(``OMP_NUM_THREADS``, ``threadpoolctl`` limits, the cores joblib counts), numba's
(``NUMBA_NUM_THREADS``, which joblib's loky workers set: inside
``GridSearchCV(n_jobs=2)`` on 2 cores each worker gets one thread) and the CPU
affinity mask of the process at the time of the call. A launch then takes only
the threads that get enough rows (:func:`_chunks`, :data:`MIN_CHUNK_ROWS`): on the
2-core machine of the benchmarks a second thread paid from about 4e5 target rows
(1.1-1.3x at 4e5-1e6) and lost up to 13% at 1e5, so smaller fits run on one
thread. Work
that calls BLAS in parallel tasks (:func:`run_tasks`) runs with BLAS on one
thread (:func:`one_blas_thread`). Launches from several Python threads at once
(``GridSearchCV`` with a threading backend, Dask workers) share the pool.

Compilation: ``cache=True`` writes the machine code next to this module (or to
numba's user cache directory when that is read-only), so only the first call on a
machine compiles: measured on the 2-core machine, a first logistic fit 0.9 s, a
first K-Means fit 1.7 s (loading from the cache: 0.01-0.05 s). Before the first
kernel compiles, one INFO line says so (:data:`COMPILE_NOTICE`);
:func:`kernels_to_compile` tells beforehand which kernels are not in the cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "COMPILE_NOTICE",
    "CompiledUnavailable",
    "fused_accumulate",
    "fused_assign",
    "fused_cross_tables",
    "fused_partial_at",
    "kernels_to_compile",
    "mu_rows",
    "mu_rows_gram",
    "mu_update",
    "n_threads",
    "numba_available",
    "one_blas_thread",
    "run_tasks",
    "segment_sum_rows",
]

logger = logging.getLogger(__name__)

#: Set to 1 to disable the compiled kernels (the NumPy code runs instead).
NO_NUMBA_ENV = "ILARGI_SKLEARN_NO_NUMBA"

_state: dict[str, Any] = {"numba": None, "kernels": {}, "compile_notice": False}
_kernels_lock = threading.Lock()

#: The kernels index their arrays through this cast. numba tests every signed index
#: for a negative value (Python's wrap-around) unless LLVM proves it cannot be,
#: which it does not for a loop over ``range(start, stop)`` or a row read from an
#: index vector; an unsigned index has no test. Only indices known to be
#: non-negative are cast, and never mixed in arithmetic with signed integers (numba
#: would promote the result to float64). Measured on the M-step's counts (2e5 rows,
#: two 1e4-row tables): 0.42 ms unsigned against 0.89 ms signed.
_u = np.uint64


def _import_numba() -> Any:
    """The numba module, or False when it cannot be imported (cached)."""
    if _state["numba"] is None:
        try:
            import numba
        except Exception as exc:  # pragma: no cover - numba is in the test extra
            # Not installed, or installed but broken (e.g. against another NumPy).
            logger.info(
                "numba cannot be imported (%s): NumPy kernels are used "
                "(pip install numba for the compiled ones).",
                exc,
            )
            _state["numba"] = False
        else:
            _state["numba"] = numba
    return _state["numba"]


def numba_available() -> bool:
    """Whether the compiled kernels are used (numba importable and not disabled)."""
    if os.environ.get(NO_NUMBA_ENV, "").strip() not in ("", "0"):
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
    (:func:`_chunks`). About 4 us per call.
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


# ----------------------------------------------------------------- kernel sources
# Plain Python functions over NumPy arrays, jitted on first use. ``idxs`` is a tuple
# of index vectors (int64, -1 for no match), one per row group; the per-group values
# are stacked into one array ``P`` whose group ``g`` starts at row ``offsets[g]``
# and whose row ``offsets[g] + pads[g]`` is what an unmatched target row takes.


# The E-step's block of 8 centers lives in one 8-lane vector (one AVX-512 register,
# two AVX ones). numba leaves LLVM's SLP vectorizer off (NUMBA_SLP_VECTORIZE=0), so
# eight scalar accumulators stayed scalar: 40 scalar FMAs per row for 5 columns, a
# 7-compare tournament, 8 scalar adds per table row. These intrinsics emit the
# vector operations on an 8-element float64 accumulator on the kernel's stack
# (``_acc8``), which LLVM keeps in a register. The arithmetic is the scalar code's,
# lane by lane (products in the sources' dtype, sums in float64, ``a + x * c``
# contracted to an FMA where the CPU has one, as ``fastmath={"contract"}`` did), so
# labels and partial distances are bitwise those of the scalar kernel. Defined on
# first use (numba is imported lazily) by the launchers of the kernels that use
# them: :func:`fused_assign`, :func:`fused_accumulate` and :func:`mu_rows`.
_acc8 = _zero8 = _fma8 = _add8 = _argmin8 = _mu2x8 = _addto8 = None
_accs24 = _slot = _addlane8 = None


def _define_vector_ops() -> None:
    """Define the 8-lane intrinsics used by :func:`_assign_chunk` (once).

    Failing that (an llvmlite or numba without these APIs), the compiled kernels
    are disabled as on a compilation failure: :class:`CompiledUnavailable`.
    """
    if _argmin8 is not None:
        return
    try:
        _build_vector_ops()
    except Exception as exc:  # pragma: no cover - llvmlite/numba API drift
        _state["numba"] = False
        logger.warning(
            "numba's vector intrinsics are unavailable (%s); the NumPy kernels "
            "are used from now on.",
            exc,
        )
        raise CompiledUnavailable(str(exc)) from exc


def _build_vector_ops() -> None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    f64 = ir.DoubleType()
    v8 = ir.VectorType(f64, 8)
    i32, i64 = ir.IntType(32), ir.IntType(64)
    contract = ("contract",)

    def lanes(context, builder, arrty, arr, offty, off):
        # The 8 elements ``arr.ravel()[off:off + 8]`` (C-contiguous ``arr``) as a
        # vector of its dtype, unaligned.
        ary = context.make_array(arrty)(context, builder, arr)
        off = context.cast(builder, off, offty, types.intp)
        ptr = builder.gep(ary.data, [off])
        ety = context.get_data_type(arrty.dtype)
        vptr = builder.bitcast(ptr, ir.VectorType(ety, 8).as_pointer())
        return builder.load(vptr, align=arrty.dtype.bitwidth // 8), ety

    def acc_ptr(context, builder, accty, acc):
        # The accumulator: the pointer from acc8.
        return builder.bitcast(acc, v8.as_pointer())

    def splat(builder, value, vty):
        vec = builder.insert_element(ir.Constant(vty, ir.Undefined), value, i32(0))
        mask = ir.Constant(ir.VectorType(i32, 8), [0] * 8)
        return builder.shuffle_vector(vec, ir.Constant(vty, ir.Undefined), mask)

    def to_f64(builder, vec, ety):
        return vec if ety == f64 else builder.fpext(vec, v8)

    @intrinsic
    def acc8(typingctx):
        # An 8-lane accumulator on the kernel's stack (an alloca in its entry
        # block), which LLVM keeps in a register: an array from np.empty stayed in
        # memory, stored after every operation (LLVM cannot tell that nothing
        # else reads it).
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, v8)
            return builder.bitcast(slot, f64.as_pointer())

        return types.CPointer(types.float64)(), codegen

    @intrinsic
    def zero8(typingctx, acc):
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, sig.args[0], args[0])
            builder.store(ir.Constant(v8, [0.0] * 8), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc), codegen

    @intrinsic
    def fma8(typingctx, acc, x, src, off):
        # acc[:8] += x * src.ravel()[off:off + 8]; the product in the wider dtype
        # of x and src (numba's promotion), the sum in float64.
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, sig.args[0], args[0])
            c, ety = lanes(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            if sig.args[1] == types.float64 or ety == f64:
                xv = context.cast(builder, args[1], sig.args[1], types.float64)
                c, ety = to_f64(builder, c, ety), f64
            else:
                xv = context.cast(builder, args[1], sig.args[1], types.float32)
            xv = splat(builder, xv, ir.VectorType(ety, 8))
            prod = to_f64(builder, builder.fmul(xv, c, flags=contract), ety)
            acc = builder.load(ptr, align=8)
            builder.store(builder.fadd(acc, prod, flags=contract), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc, x, src, off), codegen

    @intrinsic
    def add8(typingctx, acc, src, off):
        # acc[:8] += src.ravel()[off:off + 8] (in float64).
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, sig.args[0], args[0])
            p, ety = lanes(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            acc = builder.load(ptr, align=8)
            builder.store(builder.fadd(acc, to_f64(builder, p, ety)), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc, src, off), codegen

    @intrinsic
    def argmin8(typingctx, acc, bias, off):
        # (min_l e_l, first l attaining it) for e = bias.ravel()[off:off + 8] - 2 acc,
        # in float64: the first minimum, as np.argmin (the values are never NaN).
        def codegen(context, builder, sig, args):
            acc = builder.load(acc_ptr(context, builder, sig.args[0], args[0]), align=8)
            b, ety = lanes(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            two = ir.Constant(v8, [2.0] * 8)
            e = builder.fsub(
                to_f64(builder, b, ety),
                builder.fmul(two, acc, flags=contract),
                flags=contract,
            )
            m = e
            undef = ir.Constant(v8, ir.Undefined)
            for perm in (
                [4, 5, 6, 7, 0, 1, 2, 3],
                [2, 3, 0, 1, 6, 7, 4, 5],
                [1, 0, 3, 2, 5, 4, 7, 6],
            ):
                s = builder.shuffle_vector(
                    m, undef, ir.Constant(ir.VectorType(i32, 8), perm)
                )
                m = builder.select(builder.fcmp_ordered("<", s, m), s, m)
            low = builder.extract_element(m, i32(0))
            hit = builder.bitcast(
                builder.fcmp_ordered("==", e, splat(builder, low, v8)), ir.IntType(8)
            )
            cttz = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.IntType(8), [ir.IntType(8), ir.IntType(1)]),
                "llvm.cttz.i8",
            )
            lane = builder.zext(builder.call(cttz, [hit, ir.IntType(1)(0)]), i64)
            return context.make_tuple(builder, sig.return_type, [low, lane])

        return types.Tuple((types.float64, types.int64))(acc, bias, off), codegen

    @intrinsic
    def mu2x8(typingctx, num0, den0, num1, den1, W, off0, off1, eps):
        # GNMF's update of one row of W from two 8-lane blocks: lanes
        # W.ravel()[off:off + 8] *= num / den (eps where den is 0) for (num0, den0,
        # off0) and (num1, den1, off1). Both blocks are loaded before either is
        # stored, so they may overlap (rows of 9 to 15 columns): the shared lanes
        # get the same value twice. NumPy's operations in NumPy's order: the
        # quotient first, then the product.
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[4])(context, builder, args[4])

            def ptr(i):
                off = context.cast(builder, args[i], sig.args[i], types.intp)
                return builder.bitcast(builder.gep(ary.data, [off]), v8.as_pointer())

            ptrs = (ptr(5), ptr(6))
            old = [builder.load(q, align=8) for q in ptrs]
            e = context.cast(builder, args[7], sig.args[7], types.float64)
            e = splat(builder, e, v8)
            zero = ir.Constant(v8, [0.0] * 8)
            for (n, d), w, q in zip(
                ((args[0], args[1]), (args[2], args[3])), old, ptrs
            ):
                num = builder.load(acc_ptr(context, builder, None, n), align=8)
                den = builder.load(acc_ptr(context, builder, None, d), align=8)
                den = builder.select(builder.fcmp_ordered("==", den, zero), e, den)
                builder.store(builder.fmul(w, builder.fdiv(num, den)), q, align=8)
            return context.get_dummy_value()

        return (
            types.void(num0, den0, num1, den1, W, off0, off1, eps),
            codegen,
        )

    @intrinsic
    def addto8(typingctx, dst, off, acc):
        # dst.ravel()[off:off + 8] += acc (a C-contiguous float64 dst).
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            o = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = builder.bitcast(builder.gep(ary.data, [o]), v8.as_pointer())
            a = builder.load(acc_ptr(context, builder, None, args[2]), align=8)
            builder.store(builder.fadd(builder.load(ptr, align=8), a), ptr, align=8)
            return context.get_dummy_value()

        return types.void(dst, off, acc), codegen

    @intrinsic
    def accs24(typingctx):
        # 24 8-lane accumulators on the kernel's stack, the q-th at slot(accs, q).
        # Indexed by constants once LLVM unrolls the fixed-length loops over them,
        # they live in registers (as acc8's).
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, ir.ArrayType(v8, 24))
            return builder.bitcast(slot, f64.as_pointer())

        return types.CPointer(types.float64)(), codegen

    @intrinsic
    def slot(typingctx, accs, q):
        def codegen(context, builder, sig, args):
            q = context.cast(builder, args[1], sig.args[1], types.intp)
            return builder.gep(args[0], [builder.mul(q, ir.Constant(q.type, 8))])

        return types.CPointer(types.float64)(accs, q), codegen

    @intrinsic
    def addlane8(typingctx, acc, lane, value):
        # acc[lane] += value, the other lanes unchanged (a select, no branch).
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, None, args[0])
            acc = builder.load(ptr, align=8)
            lane = context.cast(builder, args[1], sig.args[1], types.int64)
            value = context.cast(builder, args[2], sig.args[2], types.float64)
            hit = builder.icmp_signed(
                "==",
                ir.Constant(ir.VectorType(i64, 8), list(range(8))),
                splat(builder, lane, ir.VectorType(i64, 8)),
            )
            new = builder.fadd(acc, splat(builder, value, v8))
            builder.store(builder.select(hit, new, acc), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc, lane, value), codegen

    globals().update(
        _acc8=acc8,
        _addlane8=addlane8,
        _zero8=zero8,
        _fma8=fma8,
        _add8=add8,
        _argmin8=argmin8,
        _mu2x8=mu2x8,
        _addto8=addto8,
        _accs24=accs24,
        _slot=slot,
    )


def _assign_chunk(
    X0,
    o0,
    ip,
    ind,
    dat,
    C3,
    idxs,
    n_groups,
    P3,
    offsets,
    pads,
    bias2,
    labels,
    best,
    c,
    start,
    stop,
):
    # Centers in blocks of 8, one 8-lane vector per row and block: the vector
    # intrinsics above (``_define_vector_ops``). The arg-min of a block is a
    # vector min tree and the first lane equal to it (as np.argmin). Four rows
    # per step (accumulators a, b, c, d): one row's chain of dependent FMAs, adds
    # and its arg-min left the CPU waiting; four rows ran 2.5 against 1.6 ms per
    # pass (2e5 rows, 5 base columns, two 1e4-row tables, k = 8).
    n_blocks, dc = C3.shape[0], C3.shape[1]
    d0 = X0.shape[1]
    a, b, c, d = _acc8(), _acc8(), _acc8(), _acc8()
    # Flat views: element offsets into C3 (n_blocks, dc, 8: dc = d0 for a dense
    # base, its number of columns for a CSR one), P3 (total, n_blocks, 8) and
    # bias2 (n_blocks, 8), all C-contiguous.
    Cf = C3.reshape(-1)
    Pf = P3.reshape(-1)
    bf = bias2.reshape(-1)
    row = 8 * n_blocks
    for i in range(start, stop, 4):
        # Past the end, the last rows repeat the first (the same values stored).
        i1 = i + 1 if i + 1 < stop else i
        i2 = i + 2 if i + 2 < stop else i
        i3 = i + 3 if i + 3 < stop else i
        u0, u1, u2, u3 = _u(i), _u(i1), _u(i2), _u(i3)
        la = lb = lc = ld = 0
        ma = mb = mc = md = np.inf
        for blk in range(n_blocks):
            _zero8(a)
            _zero8(b)
            _zero8(c)
            _zero8(d)
            for f in range(d0):
                o = (blk * dc + f) * 8
                of = o0[f]
                _fma8(a, X0[u0, f] - of, Cf, o)
                _fma8(b, X0[u1, f] - of, Cf, o)
                _fma8(c, X0[u2, f] - of, Cf, o)
                _fma8(d, X0[u3, f] - of, Cf, o)
            # A CSR base (ip None for a dense one: the branch is compiled out).
            if ip is not None:
                o = blk * dc
                for q in range(ip[u0], ip[_u(i + 1)]):
                    _fma8(a, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
                for q in range(ip[u1], ip[_u(i1 + 1)]):
                    _fma8(b, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
                for q in range(ip[u2], ip[_u(i2 + 1)]):
                    _fma8(c, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
                for q in range(ip[u3], ip[_u(i3 + 1)]):
                    _fma8(d, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
            for g in range(n_groups):
                # A select, not a branch (which mispredicts on scattered
                # unmatched rows): the pad is loaded either way.
                pad = pads[g]
                ix = idxs[g]
                og = offsets[g]
                r0, r1, r2, r3 = ix[u0], ix[u1], ix[u2], ix[u3]
                _add8(a, Pf, (og + (r0 if r0 >= 0 else pad)) * row + blk * 8)
                _add8(b, Pf, (og + (r1 if r1 >= 0 else pad)) * row + blk * 8)
                _add8(c, Pf, (og + (r2 if r2 >= 0 else pad)) * row + blk * 8)
                _add8(d, Pf, (og + (r3 if r3 >= 0 else pad)) * row + blk * 8)
            m, lane = _argmin8(a, bf, blk * 8)
            t = m < ma
            ma = m if t else ma
            la = blk * 8 + lane if t else la
            m, lane = _argmin8(b, bf, blk * 8)
            t = m < mb
            mb = m if t else mb
            lb = blk * 8 + lane if t else lb
            m, lane = _argmin8(c, bf, blk * 8)
            t = m < mc
            mc = m if t else mc
            lc = blk * 8 + lane if t else lc
            m, lane = _argmin8(d, bf, blk * 8)
            t = m < md
            md = m if t else md
            ld = blk * 8 + lane if t else ld
        labels[u3] = ld
        best[u3] = md
        labels[u2] = lc
        best[u2] = mc
        labels[u1] = lb
        best[u1] = mb
        labels[u0] = la
        best[u0] = ma


def _partial_at_chunk(
    X0,
    o0,
    ip,
    ind,
    dat,
    C,
    idxs,
    n_groups,
    P,
    offsets,
    pads,
    bias,
    labels,
    best,
    c,
    start,
    stop,
):
    d0 = X0.shape[1]
    for i in range(start, stop):
        u = _u(i)
        j = _u(labels[u])
        acc = 0.0
        for f in range(d0):
            acc += (X0[u, f] - o0[f]) * C[f, j]
        if ip is not None:
            for q in range(ip[u], ip[_u(i + 1)]):
                acc += dat[_u(q)] * C[_u(ind[_u(q)]), j]
        for g in range(n_groups):
            pad = pads[g]
            r = idxs[g][u]
            r = r if r >= 0 else pad
            acc += P[_u(offsets[g] + r), j]
        best[u] = bias[j] - 2.0 * acc


def _accumulate_chunk(
    X0,
    o0,
    ip,
    ind,
    dat,
    idxs,
    n_groups,
    offsets,
    pads,
    weights,
    labels,
    wsum,
    sums0,
    cnt,
    c,
    start,
    stop,
):
    # wsum (chunks, k), sums0 (chunks, k, d0), cnt (chunks, total * k), float64.
    d0 = X0.shape[1]
    k = wsum.shape[1]
    ws = wsum[c]
    sc = sums0[c]
    cc = cnt[c]
    # Unit weights come as None (numba compiles that case without their reads).
    wi = 1.0
    if ip is None and k <= 8 and d0 <= 12:
        # Up to 8 clusters, a dense base of up to 12 columns: the sums in
        # registers, one 8-lane vector per column with a lane per cluster (two
        # sets, for even and odd rows), each row added to its cluster's lane by
        # a select: no stores, no chains through memory when rows share a
        # cluster. The whole M-step (2e5 x 5, two 1e4-row tables, k = 8, unit
        # weights): 1.17-1.24 against 1.22-1.32 ms.
        A = _accs24()
        for q in range(24):
            _zero8(_slot(A, q))
        w0, w1 = _acc8(), _acc8()
        _zero8(w0)
        _zero8(w1)
        wj = 1.0
        for i in range(start, stop - 1, 2):
            u, v = _u(i), _u(i + 1)
            la, lb = labels[u], labels[v]
            if weights is not None:
                wi, wj = weights[u], weights[v]
            for f in range(12):
                if f < d0:
                    _addlane8(_slot(A, f), la, wi * (X0[u, f] - o0[f]))
                    _addlane8(_slot(A, 12 + f), lb, wj * (X0[v, f] - o0[f]))
            _addlane8(w0, la, wi)
            _addlane8(w1, lb, wj)
        if (stop - start) % 2:
            u = _u(stop - 1)
            la = labels[u]
            if weights is not None:
                wi = weights[u]
            for f in range(12):
                if f < d0:
                    _addlane8(_slot(A, f), la, wi * (X0[u, f] - o0[f]))
            _addlane8(w0, la, wi)
        buf = np.zeros(26 * 8)
        for q in range(24):
            _addto8(buf, q * 8, _slot(A, q))
        _addto8(buf, 24 * 8, w0)
        _addto8(buf, 25 * 8, w1)
        for j in range(k):
            ws[j] += buf[24 * 8 + j] + buf[25 * 8 + j]
            for f in range(d0):
                sc[j, f] += buf[f * 8 + j] + buf[(12 + f) * 8 + j]
    else:
        for i in range(start, stop):
            u = _u(i)
            lab = _u(labels[u])
            if weights is not None:
                wi = weights[u]
            ws[lab] += wi
            s = sc[lab]
            Xi = X0[u]
            for f in range(d0):
                s[f] += wi * (Xi[f] - o0[f])
            if ip is not None:
                for q in range(ip[u], ip[_u(i + 1)]):
                    s[_u(ind[_u(q)])] += wi * dat[_u(q)]
    # One index vector at a time: one stream of reads per pass.
    for g in range(n_groups):
        ig = idxs[g]
        base = offsets[g]
        pad = pads[g]
        for i in range(start, stop):
            u = _u(i)
            r = ig[u]
            r = r if r >= 0 else pad
            if weights is not None:
                wi = weights[u]
            cc[_u((base + r) * k + labels[u])] += wi


def _segment_rows_chunk(idx, W, out, c, start, stop):
    # out (chunks, n_bins + 1, k) float64: row n_bins collects the unmatched rows.
    o = out[c]
    pad = o.shape[0] - 1
    k = W.shape[1]
    for i in range(start, stop):
        u = _u(i)
        r = idx[u]
        orow = o[_u(r if r >= 0 else pad)]
        wi = W[u]
        for j in range(k):
            orow[j] += wi[j]


def _mu_update_chunk(num, den, W, eps):
    # W *= num / den, eps for zero denominators: all C-contiguous, one shape,
    # read as flat arrays (rows of k < 16 elements vectorize poorly).
    nf = num.reshape(-1)
    df = den.reshape(-1)
    wf = W.reshape(-1)
    for q in range(wf.shape[0]):
        v = _u(q)
        d = df[v]
        if d == 0:
            d = eps
        wf[v] *= nf[v] / d


def _mu_rows_chunk(
    X0, HbT, idxs, n_groups, G, offsets, pads, const, P, HHt, W, eps, WW, start, stop
):
    # GNMF's W update of rows [start, stop), 8 <= k <= 16 columns (all float64,
    # C-contiguous), with the numerator assembled in registers: per row
    # num = X0[i] HbT + sum_g G[offsets[g] + r_g] (+ const), den = W[i] HHt, then
    # W[i] *= num / den. Each row's k values are two 8-lane blocks, columns 0..7
    # and k-8..k-1 (overlapping for k < 16), so no load or store leaves the row.
    # Four rows per step: one row's chains (10 dependent FMAs for k = 10) left
    # the CPU idle; two rows ran 1.8x and four 2.2x faster than one (2e5 x 10).
    k = W.shape[1]
    d0 = X0.shape[1]
    h = k - 8
    Hf = HbT.reshape(-1)
    Gf = G.reshape(-1)
    Mf = HHt.reshape(-1)
    Wf = W.reshape(-1)
    # a*: numerators, e*: denominators; *0 / *1 the two blocks; one letter per row.
    # Written out row by row on purpose: the same work as loops over the four
    # rows, with the accumulators indexed like the gram's below, made fits 25%
    # slower (235 against 187 ms: the rows' operations no longer interleave).
    aa0, aa1, ae0, ae1 = _acc8(), _acc8(), _acc8(), _acc8()
    ba0, ba1, be0, be1 = _acc8(), _acc8(), _acc8(), _acc8()
    ca0, ca1, ce0, ce1 = _acc8(), _acc8(), _acc8(), _acc8()
    da0, da1, de0, de1 = _acc8(), _acc8(), _acc8(), _acc8()
    for i in range(start, stop, 4):
        # Past the end, the last rows repeat the first (computed, not stored).
        i1 = i + 1 if i + 1 < stop else i
        i2 = i + 2 if i + 2 < stop else i
        i3 = i + 3 if i + 3 < stop else i
        u0, u1, u2, u3 = _u(i), _u(i1), _u(i2), _u(i3)
        _zero8(aa0)
        _zero8(aa1)
        _zero8(ae0)
        _zero8(ae1)
        _zero8(ba0)
        _zero8(ba1)
        _zero8(be0)
        _zero8(be1)
        _zero8(ca0)
        _zero8(ca1)
        _zero8(ce0)
        _zero8(ce1)
        _zero8(da0)
        _zero8(da1)
        _zero8(de0)
        _zero8(de1)
        for f in range(d0):
            o = f * k
            x0, x1, x2, x3 = X0[u0, f], X0[u1, f], X0[u2, f], X0[u3, f]
            _fma8(aa0, x0, Hf, o)
            _fma8(aa1, x0, Hf, o + h)
            _fma8(ba0, x1, Hf, o)
            _fma8(ba1, x1, Hf, o + h)
            _fma8(ca0, x2, Hf, o)
            _fma8(ca1, x2, Hf, o + h)
            _fma8(da0, x3, Hf, o)
            _fma8(da1, x3, Hf, o + h)
        for g in range(n_groups):
            # A select, not a branch: unmatched rows (-1) take the padding row.
            pad = pads[g]
            ix = idxs[g]
            r0, r1, r2, r3 = ix[u0], ix[u1], ix[u2], ix[u3]
            o0 = (offsets[g] + (r0 if r0 >= 0 else pad)) * k
            o1 = (offsets[g] + (r1 if r1 >= 0 else pad)) * k
            o2 = (offsets[g] + (r2 if r2 >= 0 else pad)) * k
            o3 = (offsets[g] + (r3 if r3 >= 0 else pad)) * k
            _add8(aa0, Gf, o0)
            _add8(aa1, Gf, o0 + h)
            _add8(ba0, Gf, o1)
            _add8(ba1, Gf, o1 + h)
            _add8(ca0, Gf, o2)
            _add8(ca1, Gf, o2 + h)
            _add8(da0, Gf, o3)
            _add8(da1, Gf, o3 + h)
        if P is not None:
            # Rows of P: the numerator parts gathered before the loop.
            o0, o1, o2, o3 = (
                (i - start) * k,
                (i1 - start) * k,
                (i2 - start) * k,
                (i3 - start) * k,
            )
            _add8(aa0, P, o0)
            _add8(aa1, P, o0 + h)
            _add8(ba0, P, o1)
            _add8(ba1, P, o1 + h)
            _add8(ca0, P, o2)
            _add8(ca1, P, o2 + h)
            _add8(da0, P, o3)
            _add8(da1, P, o3 + h)
        if const is not None:
            _add8(aa0, const, 0)
            _add8(aa1, const, h)
            _add8(ba0, const, 0)
            _add8(ba1, const, h)
            _add8(ca0, const, 0)
            _add8(ca1, const, h)
            _add8(da0, const, 0)
            _add8(da1, const, h)
        for q in range(k):
            o = q * k
            w0, w1, w2, w3 = W[u0, q], W[u1, q], W[u2, q], W[u3, q]
            _fma8(ae0, w0, Mf, o)
            _fma8(ae1, w0, Mf, o + h)
            _fma8(be0, w1, Mf, o)
            _fma8(be1, w1, Mf, o + h)
            _fma8(ce0, w2, Mf, o)
            _fma8(ce1, w2, Mf, o + h)
            _fma8(de0, w3, Mf, o)
            _fma8(de1, w3, Mf, o + h)
        # Every row's W is read above before any is written here.
        if i3 != i:
            _mu2x8(da0, de0, da1, de1, Wf, i3 * k, i3 * k + h, eps)
        if i2 != i:
            _mu2x8(ca0, ce0, ca1, ce1, Wf, i2 * k, i2 * k + h, eps)
        if i1 != i:
            _mu2x8(ba0, be0, ba1, be1, Wf, i1 * k, i1 * k + h, eps)
        _mu2x8(aa0, ae0, aa1, ae1, Wf, i * k, i * k + h, eps)
    # W^T W of the updated rows (in L1/L2 now) into WW (k, 16): rows 0-7 in both
    # blocks, rows 8 to k-1 in the second only (the rest is their transpose),
    # 24 accumulators in registers: 1.4 against 3.7 ms for BLAS's per-block
    # products (2e5 x 10, blocks of 6,553 rows). None: not wanted (transform).
    if WW is None:
        return
    A = _accs24()
    for q in range(24):
        _zero8(_slot(A, q))
    for i in range(start, stop):
        u = _u(i)
        o = i * k
        for q in range(8):
            w = W[u, q]
            _fma8(_slot(A, q), w, Wf, o)
            _fma8(_slot(A, 8 + q), w, Wf, o + h)
        for q in range(8):
            if 8 + q < k:
                _fma8(_slot(A, 16 + q), W[u, 8 + q], Wf, o + h)
    for q in range(8):
        _addto8(WW, q * 16, _slot(A, q))
        _addto8(WW, q * 16 + 8, _slot(A, 8 + q))
        if 8 + q < k:
            _addto8(WW, (8 + q) * 16 + 8, _slot(A, 16 + q))


def _cross_chunk(idx, Zs, idxs, n_partners, offsets, weights, out, c, start, stop):
    # out (chunks, n_bins, C) float64; partner p fills columns offsets[p]:...
    A = out[c]
    # One partner at a time: one stream of table reads per pass (a single pass
    # reading all partners per row measured 1.3x slower: 5.9 against 4.5 ms).
    for p in range(n_partners):
        Z = Zs[p]
        ix = idxs[p]
        off = offsets[p]
        k = Z.shape[1]
        direct = ix.shape[0] == 0
        for i in range(start, stop):
            u = _u(i)
            j = idx[u]
            if j < 0:
                continue
            r = i
            if not direct:
                r = ix[u]
                if r < 0:
                    continue
            Aj = A[_u(j)]
            Zr = Z[_u(r)]
            if weights is None:
                for f in range(k):
                    Aj[_u(off + f)] += Zr[f]
            else:
                wi = weights[u]
                for f in range(k):
                    Aj[_u(off + f)] += wi * Zr[f]


_SOURCES = {
    "assign": _assign_chunk,
    "partial_at": _partial_at_chunk,
    "accumulate": _accumulate_chunk,
    "segment_rows": _segment_rows_chunk,
    "mu_update": _mu_update_chunk,
    "mu_rows": _mu_rows_chunk,
    "cross": _cross_chunk,
}


def register(name: str, chunk: Any) -> None:
    """Add a kernel defined in another module (a plain Python function, jitted on
    first use; a chunked one takes ``c, start, stop`` last, see :func:`_launch`)."""
    _SOURCES[name] = chunk


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
                # Contracting a * b + c into one FMA (as BLAS does): 15% faster
                # E-step. NumPy's error model (no ZeroDivisionError test on every
                # float division) lets a loop that divides vectorize: the W
                # update's loop ran 1.6x faster.
                fn = kernels[name] = numba.njit(
                    cache=True, nogil=True, fastmath={"contract"}, error_model="numpy"
                )(_SOURCES[name])
    return fn


def _kernel(name: str) -> Any:
    """The jitted kernel ``name``, after the one-time compile notice if due."""
    fn = _dispatcher(name)
    if not _state["compile_notice"] and not fn.signatures and not _cached(fn):
        _state["compile_notice"] = True
        where = getattr(getattr(fn, "_cache", None), "_cache_path", "its directory")
        logger.info(COMPILE_NOTICE, where)
    return fn


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
    the kernels it uses that are listed here, once per machine (a first fit took
    0.6-1.7 s more on a 2-core machine); the first one also logs
    :data:`COMPILE_NOTICE` at INFO on this module's logger. Cheap (reads the
    cache's index files; imports numba).

    Returns
    -------
    list of str
        Kernel names, sorted.
    """
    if not numba_available():
        return []
    # Registers the logistic objective's kernels.
    from ilargi_sklearn._backend import _compiled_glm  # noqa: F401

    return sorted(
        name
        for name in _SOURCES
        if not _dispatcher(name).signatures and not _cached(_dispatcher(name))
    )


def _index_tuple(idxs: list[np.ndarray], n_rows: int) -> tuple[tuple, int]:
    """The index vectors as a homogeneous tuple (one dummy vector when empty)."""
    if not idxs:
        return (np.zeros(n_rows, dtype=np.int64),), 0
    return tuple(np.ascontiguousarray(i, dtype=np.int64) for i in idxs), len(idxs)


def _base_arrays(X0: Any, o0: np.ndarray) -> tuple:
    """``(dense X0, indptr, indices, data)`` of the identity source for the kernels.

    A dense ``X0`` comes without a CSR part (None: numba compiles a specialization
    without the CSR loop, measured 30% faster than reading an empty one), a CSR
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


def _run(name: str, body: Callable[[Any], None]) -> None:
    """``body(kernel)`` with kernel ``name``; a compilation failure (numba installed
    but unable to compile on this platform) disables the compiled kernels for the
    process, with one warning, and raises :class:`CompiledUnavailable`."""
    try:
        body(_kernel(name))
    except Exception as exc:
        numba = _state["numba"]
        if not numba or not isinstance(exc, numba.core.errors.NumbaError):
            raise
        _state["numba"] = False
        logger.warning(
            "numba could not compile the %r kernel (%s); the NumPy kernels are "
            "used from now on.",
            name,
            exc,
        )
        raise CompiledUnavailable(str(exc)) from exc


def _call(name: str, *args: Any) -> None:
    """Run kernel ``name`` once, on the calling thread: ``kernel(*args)``."""
    _run(name, lambda kernel: kernel(*args))


def _launch(name: str, head: tuple, n: int, n_chunks: int, threads: int) -> None:
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


# ------------------------------------------------------------------ public kernels
#: Chunks per thread of a launch whose chunks sum into no per-chunk buffers: a
#: thread whose core is shared with another process takes fewer of them.
CHUNKS_PER_THREAD = 4

#: The fewest rows of a chunk, per kernel (:func:`_chunks`); kernels with
#: per-chunk sums raise it with the size of those sums.
MIN_CHUNK_ROWS = {
    "assign": 32768,  # about 0.3 ms at k <= 8; fewer rows for more centers
    "partial_at": 65536,
    "accumulate": 131072,  # one chunk per thread
    "cross": 131072,  # one chunk per thread
    "binomial": 32768,
    "logistic": 98304,  # a task of the logistic objective: 3 blocks of rows
}


def _chunks(
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
    sums, and a thread must get ``per_thread`` such chunks: on the 2-core virtual
    machine of the benchmarks a second thread paid only from 1-2 ms of work per
    launch and thread (K-Means 1.16x faster on 4e5 rows, 1.21x on 1e6; with
    chunks of 8,192 rows 0.87x on 1e5), so the kernels ask about 130,000 rows per
    thread."""
    threads = n_threads() if threads is None else threads
    used = min(threads, n // (min_rows * per_thread))
    return per_thread * used if used > 1 else 1


def fused_assign(
    X0: Any,
    o0: np.ndarray,
    C3: np.ndarray,
    idxs: list[np.ndarray],
    P3: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    bias2: np.ndarray,
    labels: np.ndarray,
    best: np.ndarray,
) -> None:
    """Fused k-means E-step: labels and partial distances of all target rows.

    The partial distance of row ``i`` to center ``j = 8 b + l`` is
    ``bias2[b, l] - 2 (sum_f (X0[i, f] - o0[f]) C3[b, f, l]
    + sum_g P3[offsets[g] + r_g, b, l])`` with ``r_g = idxs[g][i]`` (``pads[g]``
    where it is -1): the dense identity source ``X0`` is multiplied in the loop,
    every row group adds one row of its precomputed table. Centers come in blocks
    of 8; padding centers take ``bias2 = inf`` (never chosen). A CSR identity
    source is read entry by entry (``indptr``, ``indices``, ``data``) in the same
    loop.

    Parameters
    ----------
    X0 : ndarray or CSR matrix of shape (n, d0)
        Identity source (``d0`` may be 0): C-contiguous when dense.
    o0 : ndarray of shape (d0,)
        Offsets subtracted from ``X0`` (the centering of its columns); all zero
        for a CSR ``X0`` (centering would densify it).
    C3 : ndarray of shape (n_blocks, d0, 8)
        Centers on the columns of ``X0``, in blocks of 8.
    idxs : list of ndarray of int64 of shape (n,)
        One index vector per row group.
    P3 : ndarray of shape (total, n_blocks, 8)
        Stacked per-group tables (same dtype as ``X0``).
    offsets, pads : ndarray of int64 of shape (n_groups,)
        First row of each group in ``P3`` and the row an unmatched target row takes.
    bias2 : ndarray of shape (n_blocks, 8)
        Per-center constant (``||c_j||^2`` plus offset terms; inf for padding).
    labels : ndarray of int32 of shape (n,)
        Output: index of the closest center.
    best : ndarray of shape (n,)
        Output: partial distance to that center.
    """
    n = labels.shape[0]
    tup, n_groups = _index_tuple(idxs, n)
    X0d, ip, ind, dat = _base_arrays(X0, o0)
    # The kernel reads the blocked arrays through flat offsets.
    C3, P3, bias2 = (np.ascontiguousarray(a) for a in (C3, P3, bias2))
    head = (X0d, o0, ip, ind, dat, C3, tup, n_groups, P3, offsets, pads, bias2)
    head += (labels, best)
    threads = n_threads()
    if _import_numba():
        _define_vector_ops()
    min_rows = max(1, MIN_CHUNK_ROWS["assign"] // C3.shape[0])
    _launch("assign", head, n, _chunks(n, min_rows, threads), threads)


def fused_partial_at(
    X0: Any,
    o0: np.ndarray,
    C: np.ndarray,
    idxs: list[np.ndarray],
    P: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    bias: np.ndarray,
    labels: np.ndarray,
    best: np.ndarray,
) -> None:
    """Partial distance of every row to its given center ``labels[i]`` (into ``best``).

    As :func:`fused_assign` with ``C`` of shape ``(d0, k)``, ``P`` of shape
    ``(total, k)`` and ``bias`` of shape ``(k,)``.
    """
    n = labels.shape[0]
    tup, n_groups = _index_tuple(idxs, n)
    X0d, ip, ind, dat = _base_arrays(X0, o0)
    head = (X0d, o0, ip, ind, dat, C, tup, n_groups, P, offsets, pads, bias)
    head += (labels, best)
    threads = n_threads()
    min_rows = MIN_CHUNK_ROWS["partial_at"]
    _launch("partial_at", head, n, _chunks(n, min_rows, threads), threads)


def fused_accumulate(
    X0: Any,
    o0: np.ndarray,
    idxs: list[np.ndarray],
    offsets: np.ndarray,
    pads: np.ndarray,
    weights: np.ndarray | None,
    labels: np.ndarray,
    n_clusters: int,
    total: int,
    buffers: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fused k-means M-step sums over all target rows.

    ``weights`` None stands for unit weights (the passes then read no weights).
    Returns ``wsum`` (the weight of each cluster, shape ``(k,)``), ``sums0``
    (``sum_i w_i (X0[i] - o0)`` per cluster, ``(k, d0)``; ``X0`` dense or CSR) and ``cnt`` (per
    row group, the weighted number of target rows of each (source row, cluster)
    pair, stacked like the tables, ``(total, k)``), all float64. ``buffers``
    holds the per-thread partial sums between calls.
    """
    n, d0 = X0.shape
    k = int(n_clusters)
    # Per-chunk sums of total * k entries, zeroed and summed on every call: one
    # chunk per thread, each of at least twice as many rows as entries (at 2e5
    # rows and 2e4 x 8 entries two chunks took 2.1 ms, one 1.6 ms).
    threads = n_threads()
    min_rows = max(MIN_CHUNK_ROWS["accumulate"], 2 * total * k)
    n_chunks = _chunks(n, min_rows, threads, per_thread=1)
    b = {} if buffers is None else buffers
    shape = (n_chunks, total * k)
    if b.get("cnt") is None or b["cnt"].shape != shape or b["sums0"].shape[2] != d0:
        b["cnt"] = np.zeros(shape)
        b["wsum"] = np.zeros((n_chunks, k))
        b["sums0"] = np.zeros((n_chunks, k, d0))
    else:
        b["cnt"].fill(0.0)
        b["wsum"].fill(0.0)
        b["sums0"].fill(0.0)
    tup, n_groups = _index_tuple(idxs, n)
    X0d, ip, ind, dat = _base_arrays(X0, o0)
    head = (X0d, o0, ip, ind, dat, tup, n_groups, offsets, pads, weights, labels)
    tail = (b["wsum"], b["sums0"], b["cnt"])
    if _import_numba():
        _define_vector_ops()
    _launch("accumulate", head + tail, n, n_chunks, threads)
    if n_chunks == 1:
        return b["wsum"][0], b["sums0"][0], b["cnt"][0].reshape(total, k)
    return (
        b["wsum"].sum(axis=0),
        b["sums0"].sum(axis=0),
        b["cnt"].sum(axis=0).reshape(total, k),
    )


def segment_sum_rows(idx: np.ndarray, W: np.ndarray, n_bins: int) -> np.ndarray:
    """``I^T W``: the rows of ``W`` summed per bin ``idx[i]`` (-1: dropped).

    One serial pass over the rows into the (bins x columns) float64 result: no
    n-length temporary (a CSC indicator takes 12-16 bytes per row) and, unlike
    per-thread partial sums, no copy of the result per thread (at tuple ratio 1
    the bins are as many as the rows).

    Parameters
    ----------
    idx : ndarray of int64 of shape (n,)
        Bin of each row, -1 for none.
    W : ndarray of shape (n, k)
        C-contiguous rows.
    n_bins : int

    Returns
    -------
    ndarray of float64 of shape (n_bins, k)
    """
    n, k = W.shape
    out = np.zeros((1, int(n_bins) + 1, k))
    args = (np.ascontiguousarray(idx, dtype=np.int64), np.ascontiguousarray(W), out)
    _call("segment_rows", *args, 0, 0, n)
    return out[0, :n_bins]


def mu_update(
    numerator: np.ndarray, denominator: np.ndarray, W: np.ndarray, eps: Any
) -> bool:
    """The multiplicative update ``W *= numerator / denominator`` (in place), with
    ``eps`` for zero denominators, in one compiled loop.

    NumPy's zero test, replacement, division and product in NumPy's order, so
    the same rounding, in one pass instead of four (2e5 x 10 in blocks of 6,553
    rows, with the numerator's gathers: 5.9 against 8.4 ms). Returns False, with
    ``W`` untouched, where the loop cannot run: arrays not C-contiguous or of
    different shapes or dtypes (the caller then runs NumPy's operations).

    Parameters
    ----------
    numerator, denominator : ndarray of shape (n, k)
    W : ndarray of shape (n, k)
        Updated in place.
    eps : scalar of ``W``'s dtype
    """
    arrays = (numerator, denominator, W)
    if any(
        not a.flags.c_contiguous or a.shape != W.shape or a.dtype != W.dtype
        for a in arrays
    ):
        return False
    _call("mu_update", *arrays, eps)
    return True


#: Row lengths of W that :func:`mu_rows` takes: two 8-lane blocks per row.
MU_ROWS_COLUMNS = (8, 16)


def mu_rows(
    X0: np.ndarray,
    HbT: np.ndarray,
    idxs: list[np.ndarray],
    G: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    const: np.ndarray | None,
    P: np.ndarray | None,
    HHt: np.ndarray,
    W: np.ndarray,
    eps: float,
    WW: np.ndarray,
    start: int,
    stop: int,
) -> bool:
    """GNMF's multiplicative W update of rows ``[start, stop)`` (in place), the
    numerator and denominator of each row computed in registers, and the
    updated rows' ``W^T W`` added to ``WW``.

    Per row ``i``: ``num = X0[i] @ HbT + sum_g G[offsets[g] + r_g] (+ P[i - start])
    (+ const)`` with ``r_g = idxs[g][i]`` (``pads[g]`` where it is -1),
    ``den = W[i] @ HHt`` (``eps`` where 0), ``W[i] *= num / den``. ``P`` holds
    numerator parts gathered beforehand (the caller's ``np.take`` from tables too
    large for cache, which it reads faster than this loop). This replaces the block's numerator assembly
    (a small GEMM and one ``np.take`` per group), the GEMM ``W_b H H^T`` and the
    element-wise update, which pass over ``n x k`` arrays in memory: at 2e5 x 10
    with a 5-column base and two 1e4-row tables, 3.7 against 7.5 ms. Sums run in
    another order than BLAS's, so W agrees with the NumPy pass to rounding.

    Returns False, with ``W`` untouched, where the loop does not apply: ``W`` not
    of 8 to 16 columns (:data:`MU_ROWS_COLUMNS`), an array not float64 or not
    C-contiguous, or shapes that do not match.

    Parameters
    ----------
    X0 : ndarray of shape (n, d0)
        Dense identity source (``d0`` may be 0).
    HbT : ndarray of shape (d0, k)
    idxs : list of ndarray of int64 of shape (n,)
    G : ndarray of shape (total, k)
        The groups' tables, stacked: group ``g`` from row ``offsets[g]``.
    offsets, pads : ndarray of int64 of shape (n_groups,)
    const : ndarray of shape (k,) or None
        Added to every numerator row.
    P : ndarray of shape (stop - start, k) or None
        Added to the numerator rows ``start`` to ``stop``.
    HHt : ndarray of shape (k, k)
    W : ndarray of shape (n, k)
        Updated in place (rows ``start`` to ``stop``).
    eps : float
    WW : ndarray of float64 of shape (k, 16) or None
        ``W^T W`` of the updated rows is added to it in the loop's layout
        (:func:`mu_rows_gram` takes the k x k matrix out); None skips it.
    start, stop : int
    """
    n, k = W.shape
    d0 = X0.shape[1]
    lo, hi = MU_ROWS_COLUMNS
    arrays = [a for a in (X0, HbT, G, HHt, W, const, P, WW) if a is not None]
    if (
        not lo <= k <= hi
        or (WW is not None and WW.shape != (k, 16))
        or any(a.dtype != np.float64 or not a.flags.c_contiguous for a in arrays)
        or X0.shape[0] != n
        or HbT.shape != (d0, k)
        or G.shape[1] != k
        or HHt.shape != (k, k)
        or (const is not None and const.shape != (k,))
        or (P is not None and P.shape != (stop - start, k))
    ):
        return False
    # Without groups the loop reads no index: a one-element stand-in.
    tup, n_groups = _index_tuple(idxs, n if idxs else 1)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    pads = np.ascontiguousarray(pads, dtype=np.int64)
    if _import_numba():
        _define_vector_ops()
    args = (X0, HbT, tup, n_groups, G, offsets, pads, const, P, HHt, W, float(eps))
    _call("mu_rows", *args, WW, int(start), int(stop))
    return True


def mu_rows_gram(WW: np.ndarray, k: int) -> np.ndarray:
    """The k x k ``W^T W`` from :func:`mu_rows`' accumulator ``WW`` (k, 16).

    Its first 8 lanes are columns 0 to 7 and its last 8 columns ``k - 8`` to
    ``k - 1``; rows 0 to 7 hold both, rows 8 to ``k - 1`` the second block only,
    and the rest is the transpose of rows 0 to 7.
    """
    G = np.empty((k, k))
    top = WW[:8, 24 - k :]  # rows 0-7, columns 8 to k-1
    G[:8, :8] = WW[:8, :8]
    G[:8, 8:] = top
    G[8:, :8] = top.T
    G[8:, 8:] = WW[8:, 24 - k :]
    return G


def fused_cross_tables(
    idx: np.ndarray,
    n_bins: int,
    partners: list[tuple[np.ndarray, np.ndarray | None]],
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """``I^T diag(w) [Z_1 | Z_2 | ...]``: per bin, the partners' rows of its target rows.

    Partner ``(Z, g)`` contributes row ``g[i]`` of ``Z`` for target row ``i`` (row
    ``i`` itself when ``g`` is None; nothing where ``g[i]`` is -1): with ``Z`` a
    source and ``g`` its index vector this is ``I^T diag(w) I_g Z``, a gram's cross
    term before the last small product. One pass over the target rows per partner,
    into per-thread float64 tables (``n_bins`` x total columns each), summed.

    Parameters
    ----------
    idx : ndarray of int of shape (n,)
        Bin of each target row, -1 for none.
    n_bins : int
    partners : list of (ndarray of shape (m_p, k_p), ndarray of int of shape (n,) or None)
        Dense values, all of one dtype, and their row of each target row.
    weights : ndarray of shape (n,), optional

    Returns
    -------
    ndarray of float64 of shape (n_bins, sum of k_p)
    """
    n = idx.shape[0]
    m = int(n_bins)
    widths = [int(Z.shape[1]) for Z, _ in partners]
    offsets = np.cumsum([0] + widths[:-1]).astype(np.int64)
    # Per-chunk tables cost n_chunks * m rows: at least 4 target rows per row,
    # one chunk per thread.
    threads = n_threads()
    n_chunks = _chunks(n, max(4 * m, MIN_CHUNK_ROWS["cross"]), threads, per_thread=1)
    out = np.zeros((n_chunks, m, sum(widths)))
    Zs = tuple(np.ascontiguousarray(Z) for Z, _ in partners)
    empty = np.zeros(0, dtype=np.int64)
    idxs = tuple(
        empty if g is None else np.ascontiguousarray(g, dtype=np.int64)
        for _, g in partners
    )
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    head = (np.ascontiguousarray(idx, dtype=np.int64), Zs, idxs, len(Zs), offsets, w)
    _launch("cross", head + (out,), n, n_chunks, threads)
    return out[0] if n_chunks == 1 else out.sum(axis=0)
