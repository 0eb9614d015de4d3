"""Threads of the compiled kernels: how many, how work is split, and the results."""

import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.datasets import make_multi_source
from ilargi_sklearn.linear_model import FactorizedLogisticRegression
from ilargi_sklearn.linear_model._loss import _objective
from ilargi_sklearn.multisource import _gram_numba
from ilargi_sklearn.utils._testing import random_dataset

numba = pytest.importorskip("numba")


# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


# ---------------------------------------------------------------- thread count
def test_threads_follow_threadpoolctl_limits():
    free = _launcher.n_threads()
    assert 1 <= free <= max(1, len(os.sched_getaffinity(0)))
    with threadpool_limits(limits=1):
        assert _launcher.n_threads() == 1
    with threadpool_limits(limits=1, user_api="openmp"):
        assert _launcher.n_threads() == 1
    # A BLAS limit is not an OpenMP one (as for scikit-learn's own kernels).
    with threadpool_limits(limits=1, user_api="blas"):
        assert _launcher.n_threads() == free
    assert _launcher.n_threads() == free


@pytest.fixture
def eight_cpus(monkeypatch):
    """scikit-learn and numba see 8 CPUs (numba's threading layer not started)."""
    monkeypatch.setattr(_launcher, "_openmp_threads", lambda: 8)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 8)
    monkeypatch.setattr(numba.np.ufunc.parallel, "_is_initialized", False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


def test_threads_follow_the_affinity_mask(monkeypatch, eight_cpus):
    assert _launcher.n_threads() == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert _launcher.n_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5})
    assert _launcher.n_threads() == 3


def test_threads_follow_numba_num_threads(monkeypatch, eight_cpus):
    # What joblib's loky workers set (with OMP_NUM_THREADS): one thread each when
    # GridSearchCV(n_jobs=2) shares two cores.
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    assert _launcher.n_threads() == 1
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 4)
    assert _launcher.n_threads() == 4


def test_threads_follow_numba_set_num_threads():
    # Where numba's own threading layer runs, its runtime setting counts too.
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert _launcher.n_threads() == 1
    finally:
        numba.set_num_threads(before)


def _worker_threads(_):
    from ilargi_sklearn._backend import _launcher

    return (
        _launcher.n_threads(),
        os.environ.get("OMP_NUM_THREADS"),
        os.environ.get("NUMBA_NUM_THREADS"),
    )


@pytest.mark.slow
def test_loky_workers_get_their_share():
    from joblib import Parallel, cpu_count, delayed

    results = Parallel(n_jobs=2, backend="loky")(
        delayed(_worker_threads)(i) for i in range(2)
    )
    share = max(cpu_count() // 2, 1)
    for threads, omp, nb in results:
        # joblib sets both variables in its workers; the kernels follow them.
        assert omp == nb == str(share)
        assert 1 <= threads <= share


# ------------------------------------------------------------- chunks and pool
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 40_000, 10**6])
def test_never_more_chunks_or_threads_than_work(n, threads):
    for per_thread in (1, 4):
        c = _launcher.chunks(n, 4096, threads, per_thread)
        used = c // per_thread
        if c == 1:
            # Serial: no thread would get per_thread chunks of 4096 rows.
            assert threads == 1 or n < 2 * per_thread * 4096
        else:
            assert c % per_thread == 0 and 2 <= used <= threads
            assert n // c >= 4096  # every chunk has its rows
        if threads > 1 and n >= per_thread * threads * 4096:
            assert c == per_thread * threads


def _run_recording(n_tasks, threads):
    seen = []

    def task(t):
        time.sleep(0.002)
        seen.append((t, threading.get_ident()))

    _launcher.run_tasks(task, n_tasks, threads)
    return seen


def test_pool_runs_every_chunk_once_on_no_more_threads_than_chunks():
    caller = threading.get_ident()
    seen = _run_recording(1, 4)
    assert seen == [(0, caller)]  # one chunk: the caller alone, no helper woken
    seen = _run_recording(12, 3)
    assert sorted(t for t, _ in seen) == list(range(12))
    assert len({ident for _, ident in seen}) <= 3
    seen = _run_recording(2, 8)
    assert sorted(t for t, _ in seen) == [0, 1]
    assert len({ident for _, ident in seen}) <= 2


def test_pool_does_not_wait_for_a_busy_helper():
    # Every helper is held by a slow chunk of another launch (as helpers whose
    # cores other processes took): a second launch runs all its chunks on its
    # own caller instead of waiting for a helper.
    n = 9
    started = threading.Semaphore(0)
    release = threading.Event()

    def slow(t):
        started.release()
        release.wait(10)

    other = threading.Thread(target=_launcher.run_tasks, args=(slow, n, n))
    other.start()
    try:
        for _ in range(n):  # the other caller and all n - 1 helpers
            assert started.acquire(timeout=10)
        t0 = time.perf_counter()
        seen = _run_recording(6, 2)
        elapsed = time.perf_counter() - t0
        assert sorted(t for t, _ in seen) == list(range(6))
        assert {ident for _, ident in seen} == {threading.get_ident()}
        assert elapsed < 5
    finally:
        release.set()
        other.join(10)
    assert not other.is_alive()


def test_pool_raises_a_chunk_error_after_the_running_chunks():
    done = []

    def task(t):
        if t == 1:
            raise ValueError("chunk 1 failed")
        time.sleep(0.01)
        done.append(t)

    with pytest.raises(ValueError, match="chunk 1 failed"):
        _launcher.run_tasks(task, 16, 2)
    assert len(done) < 15  # no chunk is handed out after the failure
    # The pool still works.
    assert sorted(t for t, _ in _run_recording(4, 2)) == [0, 1, 2, 3]


def test_concurrent_launches_from_several_threads():
    # GridSearchCV with a threading backend, Dask's threads: launches at once.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20_000, 8))
    W = rng.standard_normal((20_000, 4))
    idx = rng.integers(-1, 50, 20_000)
    expect = np.zeros((51, 4))
    np.add.at(expect, np.where(idx < 0, 50, idx), W)
    errors = []

    def work():
        try:
            for _ in range(5):
                got = _gram_numba.fused_cross_tables(idx, 50, [(W, None)])
                np.testing.assert_allclose(got, expect[:50], rtol=1e-12)
                _launcher.run_tasks(lambda t: X[t::4] @ W[:8], 4, 2)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_run_tasks_limits_blas_meanwhile_and_restores_it():
    def blas_threads():
        return {d["filepath"]: d["num_threads"] for d in threadpool_info()}

    before = blas_threads()
    inside = []
    _launcher.run_tasks(lambda t: inside.append(blas_threads()), 2, 2)
    blas = {d["filepath"] for d in threadpool_info() if d["user_api"] == "blas"}
    assert inside and all(all(v[p] == 1 for p in blas) for v in inside)
    assert blas_threads() == before
    with _launcher.one_blas_thread():
        with _launcher.one_blas_thread():
            pass
        assert all(blas_threads()[p] == 1 for p in blas)  # the outer one holds
    assert blas_threads() == before


def test_run_kernel_tasks_runs_each_task_once_and_leaves_blas_alone():
    def blas_threads():
        return {d["filepath"]: d["num_threads"] for d in threadpool_info()}

    before = blas_threads()
    inside, names, ran = [], set(), []
    lock = threading.Lock()

    def task(t):
        with lock:
            ran.append(t)
            names.add(threading.current_thread().name)
            inside.append(blas_threads())

    _launcher.run_kernel_tasks(task, 8, 2)
    assert sorted(ran) == list(range(8))
    assert all(v == before for v in inside)  # no BLAS limit set meanwhile
    assert blas_threads() == before
    # One task or one thread: the calling thread alone.
    names.clear()
    _launcher.run_kernel_tasks(task, 1, 2)
    _launcher.run_kernel_tasks(task, 3, 1)
    assert names == {threading.current_thread().name}
    assert sorted(ran[8:]) == [0, 0, 1, 2]


def test_compile_failure_after_another_thread_disabled_the_kernels(monkeypatch):
    # Two tasks of one launch both fail to compile: the first disables the
    # kernels, the second's failure must still come out as CompiledUnavailable
    # (the callers' signal to run the NumPy code), not as numba's own error.
    numba = pytest.importorskip("numba")
    monkeypatch.setitem(_launcher._state, "numba", False)  # disabled meanwhile

    def body(kernel):
        raise numba.core.errors.TypingError("planted compile failure")

    monkeypatch.setattr(_launcher, "_kernel", lambda name: None)
    with pytest.raises(_launcher.CompiledUnavailable, match="could not compile"):
        _launcher._run("products_source", body)


# ----------------------------------------------------- results do not depend on it
@pytest.fixture
def launches(monkeypatch):
    """Small chunks (so that small data take several threads), and a record of
    ``(n_chunks, threads)`` of every launch that used more than one thread."""
    monkeypatch.setattr(_launcher, "MIN_CHUNK_ROWS", dict.fromkeys(_MIN_ROWS, 2000))
    seen = []
    original = _launcher._pool.run

    def run(task, n_chunks, threads):
        if min(n_chunks, threads) > 1:
            seen.append((n_chunks, threads))
        return original(task, n_chunks, threads)

    monkeypatch.setattr(_launcher._pool, "run", run)
    return seen


_MIN_ROWS = dict(_launcher.MIN_CHUNK_ROWS)


@pytest.mark.parametrize("scenario", ["left", "sparse"])
def test_kmeans_equal_on_one_two_and_three_threads(scenario, monkeypatch, launches):
    ds = random_dataset(3, n_rows=30_000, scenario=scenario)
    init = np.asarray(ds.materialize("dense"))[:: 30_000 // 6][:6]
    fits = {}
    for t in (1, 2, 3):
        monkeypatch.setattr(_launcher, "n_threads", lambda t=t: t)
        fits[t] = FactorizedKMeans(6, init=init, max_iter=5, tol=0).fit(ds)
        assert (t == 1) == (not launches)  # threads were used from t = 2
    for t in (2, 3):
        np.testing.assert_array_equal(fits[t].labels_, fits[1].labels_)
        np.testing.assert_allclose(
            fits[t].cluster_centers_, fits[1].cluster_centers_, rtol=1e-10, atol=1e-12
        )
        np.testing.assert_allclose(fits[t].inertia_, fits[1].inertia_, rtol=1e-10)


def test_gram_equal_on_one_and_two_threads(monkeypatch, launches):
    ds = random_dataset(4, n_rows=30_000, scenario="many_to_many")
    grams = {}
    for t in (1, 2):
        monkeypatch.setattr(_launcher, "n_threads", lambda t=t: t)
        grams[t] = ds.operator.gram()
    assert launches and all(threads == 2 for _, threads in launches)
    np.testing.assert_allclose(grams[2], grams[1], rtol=1e-12, atol=1e-9)


def test_logistic_equal_on_one_and_two_threads(monkeypatch):
    # Four blocks of 32,768 rows, a task of one block allowed.
    limits = {**_launcher.MIN_CHUNK_ROWS, "logistic": 32768}
    monkeypatch.setattr(_launcher, "MIN_CHUNK_ROWS", limits)
    ds = make_multi_source(100_000, tuple_ratio=20, random_state=0).dataset
    rng = np.random.default_rng(0)
    y = (rng.random(ds.shape[0]) < 0.5).astype(float)
    w = rng.standard_normal(ds.shape[1] + 1)
    objective = _objective(ds.operator, "binomial")
    args = (w, y, None, float(ds.shape[0]), 1.0, True, 1)
    tasks = []
    original = _launcher.run_tasks

    def spy(task, n_tasks, threads):
        tasks.append((n_tasks, threads))
        return original(task, n_tasks, threads)

    monkeypatch.setattr(_launcher, "run_tasks", spy)
    out = {}
    for t in (1, 2):
        monkeypatch.setattr(_launcher, "n_threads", lambda t=t: t)
        out[t] = objective(*args)
    # One task on one thread, two per thread on two.
    assert tasks == [(1, 1), (4, 2)]
    np.testing.assert_allclose(out[2][0], out[1][0], rtol=1e-12)
    np.testing.assert_allclose(out[2][1], out[1][1], rtol=1e-10, atol=1e-13)
    fits = {}
    for t in (1, 2):
        monkeypatch.setattr(_launcher, "n_threads", lambda t=t: t)
        fits[t] = FactorizedLogisticRegression(max_iter=30).fit(ds, y)
    np.testing.assert_allclose(fits[2].coef_, fits[1].coef_, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------- compile notice
def _triple(x, out):
    for i in range(x.shape[0]):
        out[i] = 3.0 * x[i]


def _quadruple(x, out):
    for i in range(x.shape[0]):
        out[i] = 4.0 * x[i]


def test_compile_notice_once_before_the_first_compile(monkeypatch, caplog, tmp_path):
    # An empty cache: the kernels compile. The notice comes once per process, the
    # on_compile callbacks at every compile, and neither when numba loads a kernel
    # from its cache.
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(_launcher._state, "compile_notice", False)
    monkeypatch.setitem(_launcher._state, "kernels", {})
    monkeypatch.setitem(_launcher._SOURCES, "test_triple", _triple)
    monkeypatch.setitem(_launcher._SOURCES, "test_quadruple", _quadruple)
    assert {"test_triple", "test_quadruple"} <= set(_launcher.kernels_to_compile())
    compiled = []
    remove = _launcher.on_compile(compiled.append)
    x, out = np.arange(3.0), np.zeros(3)
    try:
        with caplog.at_level(logging.INFO, logger=_launcher.__name__):
            _launcher.call("test_triple", x, out)
            _launcher.call("test_triple", x, out)
            _launcher.call("test_quadruple", x, out)
            _launcher._state["kernels"].clear()  # a new process, in effect
            _launcher.call("test_triple", x, out)
    finally:
        remove()
    np.testing.assert_array_equal(out, 3 * x)
    assert compiled == ["test_triple", "test_quadruple"]
    notices = [r for r in caplog.records if "Compiling" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.INFO
    assert "later runs load them from numba's cache" in notices[0].getMessage()
    assert str(tmp_path) in notices[0].getMessage()
    assert "test_triple" not in _launcher.kernels_to_compile()


def test_kernels_to_compile_reads_the_cache(monkeypatch, caplog):
    ds = random_dataset(1, n_rows=300, scenario="star")
    FactorizedKMeans(3, random_state=0).fit(ds)  # compiles or loads the kernels
    pending = _launcher.kernels_to_compile()
    assert "assign" not in pending and "accumulate" not in pending
    # A fresh process sees the cache numba wrote: no notice for these kernels.
    monkeypatch.setitem(_launcher._state, "compile_notice", False)
    monkeypatch.setitem(_launcher._state, "kernels", {})
    assert _launcher._cached(_launcher._dispatcher("assign"))
    with caplog.at_level(logging.INFO, logger=_launcher.__name__):
        _launcher._kernel("assign")
    assert "Compiling" not in caplog.text
    monkeypatch.setenv(_launcher.NO_NUMBA_ENV, "1")
    assert _launcher.kernels_to_compile() == []


_FRESH_PROCESS = """
import logging, sys
import numpy as np
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.decomposition import _gnmf_numba
from ilargi_sklearn.multisource import _gram_numba
print("pending", "segment_rows" in _launcher.kernels_to_compile())
idx = np.array([0, 2, -1, 2])
W = np.arange(8.0).reshape(4, 2)
print(_gnmf_numba.segment_sum_rows(idx, W, 3).tolist())
_gnmf_numba.segment_sum_rows(idx, W, 3)
"""


@pytest.mark.slow
def test_compile_notice_in_fresh_processes(tmp_path):
    # An empty numba cache: the first process compiles (one notice), the second
    # loads the kernel from the cache (no notice, nothing pending).
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop(_launcher.NO_NUMBA_ENV, None)
    runs = [
        subprocess.run(
            [sys.executable, "-c", _FRESH_PROCESS],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        for _ in range(2)
    ]
    first, second = runs
    assert first.stdout.splitlines()[0] == "pending True"
    assert first.stderr.count("Compiling ilargi_sklearn's numba kernels") == 1
    assert str(tmp_path) in first.stderr
    assert second.stdout.splitlines()[0] == "pending False"
    assert "Compiling" not in second.stderr
    for run in runs:
        assert run.stdout.splitlines()[1] == "[[0.0, 1.0], [0.0, 0.0], [8.0, 10.0]]"


_FORKED = """
import os, threading, time
from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.decomposition import _gnmf_numba
from ilargi_sklearn.multisource import _gram_numba

def task(t):
    time.sleep(0.02)
    done.append((t, threading.get_ident()))

done = []
_launcher.run_tasks(task, 4, 2)  # the parent starts a helper thread
pid = os.fork()
if pid == 0:
    # The child has no helper thread: the pool starts its own.
    done = []
    _launcher.run_tasks(task, 8, 2)
    ok = sorted(t for t, _ in done) == list(range(8))
    os._exit(0 if ok and len({i for _, i in done}) == 2 else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), sorted(t for t, _ in done))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_pool_works_in_a_forked_child():
    out = subprocess.run(
        [sys.executable, "-c", _FORKED],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.split() == ["0", "[0,", "1,", "2,", "3]"]
