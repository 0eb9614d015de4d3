"""One-command GPU check: CuPy call patterns, GPU-vs-CPU agreement, then timings.

Usage (repository root)::

    python benchmarks/gpu_check.py              # on a machine with an NVIDIA GPU
    python benchmarks/gpu_check.py --dry-run    # anywhere: NumPy stands in for CuPy

On a machine without a usable GPU (and without ``--dry-run``) it prints
``no GPU: <reason>`` and exits 0.

How to run on a GPU machine
---------------------------
The target is a bare machine with one NVIDIA GPU, Python 3.12, CuPy (``cupy-cuda13x``),
NumPy, SciPy, scikit-learn, pandas, pytest and hypothesis, and no internet. The
package is not installed there: the script puts the repository root on
``sys.path`` (and on ``PYTHONPATH`` for its pytest child). Of the package's
dependencies only the pure-Python ``array-api-compat`` is missing there, so carry its
wheel. Once, here, in the repository root::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl array-api-compat==1.16.0

(a ``py3-none-any`` wheel of 80 kB with no dependencies; add ``scikit-learn`` the same way if the
machine's scikit-learn is older than 1.6, which the script reports). Then the one
device command, with ``carry=[".whl"]`` and ``timeout_s=420``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \\
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site \\
        || exit; PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py

Results go to ``$OUT`` when that variable is set (else ``benchmarks/results/
gpu_check/``): ``gpu_check.jsonl`` (one JSON line per check or timing, written as
it goes, so a killed run keeps what it measured), ``gpu_check_pytest.log``,
``gpu_check_table.txt`` and ``gpu_records.jsonl``: every timed fit of the four
planned estimators as a cost-model training record (``ilargi_sklearn.planner.
read_records`` / ``train_cost_model`` take it beside the calibration records, so
that GPU plans are learned instead of predicted by the roofline alone). Five files
at most, well inside what a device run brings back.

What it does, in order, each case isolated (an error is recorded and the run goes
on) and the whole run held to ``--budget`` seconds (default 250: under the
5 minutes of DESIGN.md section 9, with room for the machine's start inside a
15-minute lease). A case whose time at the previous size, scaled to this one,
would not fit in what is left is recorded as skipped; a watchdog stops a hung run
``--watchdog`` seconds (default 45) past the budget, after dumping every thread's
stack and printing the table of what was recorded (exit code 3):

1. environment: versions of Python, NumPy, SciPy, scikit-learn, pandas, CuPy,
   array-api-compat, numba, and the GPU probe's answer;
2. ``api``: every CuPy / cupyx call pattern the package uses, on tiny inputs
   against NumPy/SciPy (``cupy.add.at`` and ``cupyx.scatter_add`` in float64 and
   float32 with the deprecation warning recorded, ``take`` with -1, ``cumsum`` into
   an int32 view, CSR construction from index vectors, dense arrays and SciPy,
   SpMV/SpMM and their transposes, ``multiply`` by a column, row and column
   selection, COO round trip, ``diags``, SpGEMM, ``cupy.linalg`` through
   ``array_api_compat.cupy``, random generators, device properties, the
   ``cupyx.scipy.sparse.linalg`` import, host-to-device copy safety);
3. ``pytest``: ``tests/gpu`` in a child process with a timeout (deprecation and
   future warnings are shown, not turned into errors, since the machine's CuPy and
   NumPy are newer than the ones the suite is pinned against);
4. ``agree`` and ``time``: on synthetic star schemas (``--rows``), each operator
   and each estimator (linear and logistic regression, k-means, GNMF, the
   scaler), factorized and materialized, on the GPU and on the CPU: the median of
   ``--repeats`` timed runs after a discarded warm-up, the device synchronized,
   and the GPU result's largest deviation from the CPU result;
5. the table, printed last (``status`` counts, failures, then the timings).

The exit code is 0 when nothing failed (skips are not failures), 1 otherwise.

``--dry-run`` runs the same code with NumPy/SciPy in place of CuPy/cupyx for the
``api`` phase and, for the "GPU" side of phases 4, ``array_api_strict`` on a second
device when it is installed (the test suite's stand-in for CuPy) or NumPy; it
uses small sizes by default. It checks the script, not the GPU.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("ilargi_sklearn") is None:  # not installed (GPU machine)
    sys.path.insert(0, str(ROOT))

OPS = ("matmul", "rmatmul", "gram", "col_sums", "row_sq_norms")


# ----------------------------------------------------------------- bookkeeping
class Budget:
    """Wall-clock budget of the whole run (seconds since construction)."""

    def __init__(self, seconds: float) -> None:
        self.t0 = time.perf_counter()
        self.seconds = float(seconds)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()


class Recorder:
    """Collects records and appends each one to a JSON-lines file at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def add(self, phase: str, name: str, status: str, **fields: Any) -> dict:
        rec = {"phase": phase, "name": name, "status": status, **fields}
        self.records.append(rec)
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
        return rec


def _err(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    return msg if len(msg) <= 400 else msg[:397] + "..."


def _run_case(
    rec: Recorder,
    budget: Budget,
    phase: str,
    name: str,
    fn: Callable[[], Any],
    reserve: float = 0.0,
    **fields: Any,
) -> Any:
    """Run ``fn`` and record ``ok`` / ``fail`` / ``skip``; never raises.

    ``fn`` returns a detail string, a dict of fields to record, or a
    ``("skip" | "info", detail)`` pair. ``reserve``: seconds the case is expected
    to need; it is skipped when fewer are left in the budget.
    """
    if budget.left() < reserve:
        rec.add(phase, name, "skip", detail="time budget spent", **fields)
        return None
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - one failing case must not stop the run
        tb = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in tb if "ilargi_sklearn" in f.filename]
        frames = [f for f in (ours[-1:] + tb[-1:]) if f is not None]
        # Innermost frame of the package, then the innermost frame overall.
        where = " < ".join(
            dict.fromkeys(
                f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}"
                for f in frames
            )
        )
        rec.add(
            phase,
            name,
            "fail",
            detail=_err(exc),
            where=where,
            seconds=time.perf_counter() - t0,
            **fields,
        )
        return None
    seconds = time.perf_counter() - t0
    if isinstance(out, tuple) and len(out) == 2 and out[0] in ("skip", "info"):
        rec.add(phase, name, out[0], detail=out[1], seconds=seconds, **fields)
    elif isinstance(out, dict):
        rec.add(phase, name, "ok", seconds=seconds, **{**fields, **out})
    else:
        rec.add(phase, name, "ok", detail=out, seconds=seconds, **fields)
    return out


# ------------------------------------------------------------------- backends
class Backend:
    """What stands for CuPy: the real thing, or NumPy/SciPy in a dry run.

    ``xp``/``sparse``/``compat`` are the array module, its sparse module and its
    ``array_api_compat`` namespace for the ``api`` phase; ``ns``/``dev`` are the
    namespace and device of the "GPU" side of the agreement and timing phases.
    """

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        if dry_run:
            import array_api_compat.numpy as compat

            self.name = "numpy (dry run)"
            self.xp, self.sparse, self.compat = np, sp, compat
            self.add_at = np.add.at
            self.scatter_add = np.add.at  # stands in for cupyx.scatter_add
            self.upload = lambda a: np.array(a, copy=True)
            self.sync = lambda: None
            if importlib.util.find_spec("array_api_strict") is not None:
                import array_api_strict

                self.ns = array_api_strict
                self.dev = array_api_strict.Device("device1")
                self.name += ", array_api_strict device1 as the GPU side"
            else:
                self.ns, self.dev = compat, "cpu"
            return
        import array_api_compat.cupy as compat
        import cupy
        import cupyx
        import cupyx.scipy.sparse as cusp

        self.name = "cupy " + cupy.__version__
        self.cupy = cupy
        self.xp, self.sparse, self.compat = cupy, cusp, compat
        self.add_at = cupy.add.at
        self.scatter_add = cupyx.scatter_add
        self.upload = cupy.asarray
        self.sync = lambda: cupy.cuda.Device().synchronize()
        self.ns, self.dev = compat, None

    def host(self, a: Any) -> Any:
        """A NumPy array (SciPy matrix for sparse input) of ``a``."""
        if a is None or isinstance(a, np.ndarray) or sp.issparse(a):
            return a
        if hasattr(a, "get"):
            return a.get()
        from ilargi_sklearn._backend._namespace import to_numpy

        return to_numpy(a)

    def dense(self, a: Any) -> np.ndarray:
        h = self.host(a)
        return np.asarray(h.toarray() if sp.issparse(h) else h)

    def move(self, ds: Any) -> Any:
        """The dataset on the "GPU" side."""
        if not self.dry_run:
            return ds.to_device("gpu")
        if self.dev == "cpu":
            return ds
        return ds.to_device(self.dev, namespace=self.ns)

    def array(self, a: Any) -> Any:
        """A host array moved to the "GPU" side of phase 4."""
        from ilargi_sklearn._backend._namespace import asarray_on

        return asarray_on(a, self.ns, self.dev)


def _close(got: Any, want: Any, dtype: Any, what: str = "") -> float:
    """Assert ``got`` (host) equals ``want`` within a dtype-aware tolerance."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"{what} shape {got.shape} != {want.shape}")
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    if not err <= tol:
        raise AssertionError(f"{what} relative error {err:.3g} > {tol:g}")
    return err


# ------------------------------------------------------------ phase 2: api
def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _sprand(m: int, n: int, dtype: Any = np.float64, seed: int = 0) -> sp.csr_matrix:
    return sp.random(m, n, density=0.4, format="csr", dtype=dtype, random_state=seed)


def api_add_at(bk: Backend) -> str:
    """``cupy.add.at``: the scatter-add of the probe (and the replacement that
    ``_ops.segment_sum`` uses on CuPy instead of ``cupyx.scatter_add``)."""
    rng = _rng()
    idx = rng.integers(0, 5, 60).astype(np.int32)
    for dt in (np.float64, np.float32):
        Y = rng.standard_normal((60, 3)).astype(dt)
        want = np.zeros((5, 3), dt)
        np.add.at(want, idx, Y)
        out = bk.xp.zeros((5, 3), dtype=dt)
        bk.add_at(out, bk.xp.asarray(idx), bk.xp.asarray(Y))
        _close(bk.host(out), want, dt, f"add.at {np.dtype(dt).name}")
        y1 = rng.standard_normal(60).astype(dt)
        want1 = np.zeros(5, dt)
        np.add.at(want1, idx, y1)
        out1 = bk.xp.zeros(5, dtype=dt)
        bk.add_at(out1, bk.xp.asarray(idx), bk.xp.asarray(y1))
        _close(bk.host(out1), want1, dt, f"add.at 1-D {np.dtype(dt).name}")
    return "float64 and float32, 1-D and 2-D, repeated int32 indices"


def api_scatter_add(bk: Backend) -> str:
    """``cupyx.scatter_add`` as ``_ops.segment_sum`` would call it."""
    rng = _rng()
    idx = rng.integers(-1, 4, 60).astype(np.int32)  # -1: no match
    Y = rng.standard_normal((60, 2))
    want = np.zeros((5, 2))
    np.add.at(want, idx + 1, Y)
    out = bk.xp.zeros((5, 2), dtype=np.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bk.scatter_add(out, bk.xp.asarray(idx) + 1, bk.xp.asarray(Y))
    _close(bk.host(out)[1:], want[1:], np.float64, "scatter_add")
    dep = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    return "DeprecationWarning: " + (f"yes ({dep[0].message})" if dep else "no")


def api_take(bk: Backend) -> str:
    """``xp.take`` of a zero-padded source with -1 entries (``_ops.gather_rows``)."""
    rng = _rng()
    Z = rng.standard_normal((4, 3))
    idx = np.array([0, -1, 3, 2, -1, 1], dtype=np.int32)
    Zp = np.concatenate([Z, np.zeros((1, 3))])
    got = bk.compat.take(
        bk.compat.concat([bk.xp.asarray(Z), bk.xp.zeros((1, 3))], axis=0),
        bk.xp.asarray(idx),
        axis=0,
    )
    _close(bk.host(got), np.take(Zp, idx, axis=0), np.float64, "take")
    try:
        far = bk.host(bk.xp.take(bk.xp.asarray(Z), bk.xp.asarray([4]), axis=0))
        beyond = f"index 4 of 4 rows gives row {int(np.argmax((far == Z).all(1)))}"
    except IndexError:
        beyond = "index 4 of 4 rows raises IndexError"
    return f"-1 picks the zero row; {beyond}"


def api_indicator(bk: Backend) -> str:
    """``_ops._cupy_indicator``: cumsum into an int32 view, CSR from vectors,
    then gather ``I @ Z``, scatter ``I.T @ Y`` (dense 1-D/2-D) and ``I @ S``."""
    xp = bk.xp
    idx = np.array([1, -1, 0, 1, 2, -1, 2], dtype=np.int32)
    n, r = idx.shape[0], 3
    I_np = np.zeros((n, r))
    I_np[np.nonzero(idx >= 0)[0], idx[idx >= 0]] = 1.0
    d_idx = xp.asarray(idx)
    valid = d_idx >= 0
    indptr = xp.zeros(n + 1, dtype=np.int32)
    xp.cumsum(valid, out=indptr[1:])
    np.testing.assert_array_equal(bk.host(indptr)[1:], np.cumsum(idx >= 0))
    cols = d_idx[valid]
    rng = _rng()
    for dt in (np.float64, np.float32):
        ind = bk.sparse.csr_matrix(
            (xp.ones(cols.shape[0], dtype=dt), cols, indptr), shape=(n, r)
        )
        Z = rng.standard_normal((r, 2)).astype(dt)
        Y = rng.standard_normal((n, 2)).astype(dt)
        name = np.dtype(dt).name
        _close(bk.host(ind @ xp.asarray(Z)), I_np @ Z, dt, f"I @ Z {name}")
        _close(bk.host(ind.T @ xp.asarray(Y)), I_np.T @ Y, dt, f"I.T @ Y {name}")
        _close(
            bk.host(ind.T @ xp.asarray(Y[:, 0])),
            I_np.T @ Y[:, 0],
            dt,
            f"I.T @ y {name}",
        )
        S = _sprand(r, 4, dt)
        prod = ind @ bk.sparse.csr_matrix(S)
        if not (sp.issparse(prod) or type(prod).__module__.startswith("cupyx")):
            raise AssertionError(f"I @ S gave {type(prod).__name__}, not sparse")
        _close(bk.dense(prod), I_np @ S.toarray(), dt, f"I @ S {name}")
        # Mixed dtypes: float32 sparse times a float64 dense right-hand side.
        _close(
            bk.host(ind @ xp.asarray(Z.astype(np.float64))),
            I_np @ Z,
            np.float32,
            "mixed dtypes",
        )
    return "int32 indptr/indices; float64, float32 and mixed dtypes"


def api_csr_construct(bk: Backend) -> str:
    """CSR from a dense device array (``_ops.to_format``) and from SciPy
    (``asarray_on``), ``get`` back to SciPy, index dtypes."""
    G = np.array([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]])
    m = bk.sparse.csr_matrix(bk.xp.asarray(G))
    _close(bk.dense(m), G, np.float64, "csr(dense)")
    S = _sprand(6, 5, np.float32)
    m2 = bk.sparse.csr_matrix(S)
    back = bk.host(m2)
    if not sp.issparse(back):
        raise AssertionError(f"host copy is {type(back).__name__}, not SciPy sparse")
    _close(back.toarray(), S.toarray(), np.float32, "csr(scipy)")
    # A device sparse source given to from_matrices (multisource/_terms.py): tocsr,
    # astype, sum_duplicates, eliminate_zeros (cuSPARSE csr2csr_compress).
    dup = bk.sparse.csr_matrix(
        (
            bk.xp.asarray([1.0, 0.0, 2.0, 3.0]),
            bk.xp.asarray(np.array([0, 1, 0, 2], dtype=np.int32)),
            bk.xp.asarray(np.array([0, 3, 4], dtype=np.int32)),
        ),
        shape=(2, 3),
    )
    dup = dup.tocsr().astype(np.float32)
    dup.sum_duplicates()
    dup.eliminate_zeros()
    _close(bk.dense(dup), [[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]], np.float32, "dup")
    if int(dup.nnz) != 2:
        raise AssertionError(f"nnz after sum_duplicates/eliminate_zeros: {dup.nnz}")
    return (
        f"indices {m2.indices.dtype}, indptr {m2.indptr.dtype}, data {m2.data.dtype}; "
        "sum_duplicates, eliminate_zeros"
    )


def api_sparse_ops(bk: Backend) -> str:
    """Products and reductions of ``multisource/_operators.py`` on sparse sources."""
    xp, rng = bk.xp, _rng()
    for dt in (np.float64, np.float32):
        name = np.dtype(dt).name
        S = _sprand(7, 4, dt, seed=1)
        A = S.toarray()
        dS = bk.sparse.csr_matrix(S)
        X = rng.standard_normal((4, 3)).astype(dt)
        Y = rng.standard_normal((7, 3)).astype(dt)
        c = rng.random(7).astype(dt)
        w = rng.random(4).astype(dt)
        _close(bk.host(dS @ xp.asarray(X)), A @ X, dt, f"S @ X {name}")
        _close(bk.host(dS.T @ xp.asarray(Y)), A.T @ Y, dt, f"S.T @ Y {name}")
        _close(bk.host(dS @ xp.asarray(w)), A @ w, dt, f"S @ w {name}")
        _close(bk.host(dS.T @ xp.asarray(c)), A.T @ c, dt, f"S.T @ c {name}")
        scaled = dS.multiply(xp.asarray(c)[:, None])
        _close(bk.dense(scaled), A * c[:, None], dt, f"S.multiply(col) {name}")
        _close(bk.dense(dS.multiply(dS)), A * A, dt, f"S.multiply(S) {name}")
        gram = dS.T @ dS.multiply(xp.asarray(c)[:, None])
        _close(bk.dense(gram), A.T @ (A * c[:, None]), dt, f"SpGEMM {name}")
        for axis in (0, 1):
            got = bk.dense(dS.sum(axis=axis)).reshape(-1)
            _close(got, A.sum(axis=axis), dt, f"sum(axis={axis}) {name}")
        rows = np.array([3, 0, 3, 6], dtype=np.int64)
        _close(bk.dense(dS[xp.asarray(rows)]), A[rows], dt, f"S[rows] {name}")
        cols = np.array([2, 0], dtype=np.int64)
        _close(bk.dense(dS[:, xp.asarray(cols)]), A[:, cols], dt, f"S[:, c] {name}")
        D = bk.sparse.diags(xp.asarray(w))
        _close(bk.dense(D @ (dS.T @ dS) @ D), np.diag(w) @ A.T @ A @ np.diag(w), dt)
    return "SpMV/SpMM (+transposed), multiply, SpGEMM, sum, row/col selection, diags"


def api_coo(bk: Backend) -> str:
    """``_sparse.sparse_join`` on CuPy: COO parts, remapped columns,
    concatenation of int32 and int64 index arrays, back to CSR."""
    xp = bk.xp
    S = _sprand(5, 3, np.float64, seed=2)
    col_map = np.array([4, 0, 2], dtype=np.int64)
    P = bk.sparse.coo_matrix(bk.sparse.csr_matrix(S))
    cols = xp.asarray(col_map)[P.col]
    coo = bk.sparse.coo_matrix(
        (xp.concatenate([P.data]), (xp.concatenate([P.row]), xp.concatenate([cols]))),
        shape=(5, 6),
    )
    want = np.zeros((5, 6))
    want[:, col_map] = S.toarray()
    _close(bk.dense(coo.tocsr()), want, np.float64, "coo")
    return f"row {P.row.dtype}, col {P.col.dtype}"


def api_linalg(bk: Backend) -> str:
    """``cupy.linalg`` through ``array_api_compat.cupy.linalg`` (the kernels'
    ``xp.linalg``), float64 and float32."""
    c, rng = bk.compat, _rng()
    for dt in (np.float64, np.float32):
        A = rng.standard_normal((8, 4)).astype(dt)
        G = A.T @ A + np.eye(4, dtype=dt)
        b = rng.standard_normal(4).astype(dt)
        dA, dG = bk.xp.asarray(A), bk.xp.asarray(G)
        Q, R = c.linalg.qr(dA)
        _close(bk.host(Q @ R), A, dt, "qr")
        U, s, Vt = c.linalg.svd(dA, full_matrices=False)
        _close(bk.host((U * s) @ Vt), A, dt, "svd")
        L = c.linalg.cholesky(dG)
        _close(bk.host(L @ c.matrix_transpose(L)), G, dt, "cholesky")
        vals, vecs = c.linalg.eigh(dG)
        _close(bk.host((vecs * vals) @ c.matrix_transpose(vecs)), G, dt, "eigh")
        x = c.linalg.solve(dG, bk.xp.asarray(b))
        _close(bk.host(x), np.linalg.solve(G, b), np.float32, "solve")
    return "qr, svd, cholesky, eigh, solve"


def api_compat(bk: Backend) -> str:
    """The ``array_api_compat`` calls of the kernels, with a device argument."""
    c = bk.compat
    import array_api_compat

    a = c.asarray(np.arange(6.0).reshape(2, 3))
    dev = array_api_compat.device(a)
    z = c.zeros((2, 3), dtype=c.float64, device=dev)
    b = c.asarray(np.arange(6.0).reshape(2, 3), device=dev)
    checks = {
        "zeros": (z, np.zeros((2, 3))),
        "astype": (c.astype(b, c.float32), np.arange(6.0).reshape(2, 3)),
        "concat": (c.concat([a, b], axis=0), np.concatenate([np.arange(6.0)] * 2)),
        "matrix_transpose": (c.matrix_transpose(a), np.arange(6.0).reshape(2, 3).T),
        "cumulative_sum": (c.cumulative_sum(c.ones(4)), np.arange(1.0, 5.0)),
        "searchsorted": (
            c.searchsorted(c.asarray([0.0, 1.0, 3.0]), c.asarray([2.0])),
            np.array([2]),
        ),
        "take_along_axis": (
            c.take_along_axis(a, c.asarray([[2], [0]]), axis=1),
            np.array([[2.0], [3.0]]),
        ),
        "logaddexp": (c.logaddexp(c.zeros(2), c.zeros(2)), np.log(2.0) * np.ones(2)),
        "argmin": (c.argmin(a, axis=1), np.array([0, 0])),
        "reshape": (c.reshape(a, (-1,)), np.arange(6.0)),
    }
    for name, (got, want) in checks.items():
        _close(bk.dense(got).reshape(np.shape(want)), want, np.float32, name)
    dtype = c.result_type(c.float32, c.float64)
    if dtype != c.float64:
        raise AssertionError(f"result_type(float32, float64) is {dtype}")
    _ = (float(c.sum(a)), int(c.argmax(a)), bool(c.any(a > 0)))  # implicit syncs
    return f"device {dev!r}; " + ", ".join(checks)


def api_random(bk: Backend) -> str:
    """Random generators (the hardware probe uses the legacy one)."""
    g = bk.xp.random.default_rng(0)
    x = g.standard_normal((3, 2))
    y = bk.xp.random.standard_normal((3, 2))
    u = g.random(5)
    if bk.host(x).shape != (3, 2) or bk.host(y).shape != (3, 2):
        raise AssertionError("random shapes")
    if not np.all((bk.host(u) >= 0) & (bk.host(u) < 1)):
        raise AssertionError("random() outside [0, 1)")
    return "default_rng().standard_normal/random, random.standard_normal"


def api_upload(bk: Backend) -> str:
    """Host-to-device copy safety: the host buffer is changed right after
    ``asarray`` (the package uploads temporaries that are freed at once)."""
    host = np.arange(2_000_000, dtype=np.float64)
    dev = bk.upload(host)
    host[:] = -1.0
    bk.sync()
    got = bk.host(dev)
    if not np.array_equal(got, np.arange(2_000_000, dtype=np.float64)):
        raise AssertionError("the device copy saw a later change of the host buffer")
    return "a changed host buffer does not reach the device copy"


def api_device(bk: Backend) -> Any:
    """Device properties, ``Device`` comparisons, memory pool, sparse linalg."""
    if bk.dry_run:
        import scipy.sparse.linalg  # noqa: F401 - the import is what is checked

        return ("skip", "CuPy only (scipy.sparse.linalg imports)")
    cupy = bk.cupy
    props = cupy.cuda.runtime.getDeviceProperties(0)
    keys = (
        "name",
        "totalGlobalMem",
        "multiProcessorCount",
        "memoryClockRate",
        "clockRate",
        "memoryBusWidth",
        "l2CacheSize",
    )
    missing = [k for k in keys if k not in props]
    d = cupy.cuda.Device()
    if (d == "cpu") is not False or cupy.cuda.Device(d).id != d.id:
        raise AssertionError("cupy.cuda.Device comparison or construction")
    with cupy.cuda.Device(d):
        pass
    try:
        import cupyx.scipy.sparse.linalg  # noqa: F401

        linalg = "imports"
    except Exception as exc:  # noqa: BLE001
        linalg = f"fails: {_err(exc)}"
    pool = cupy.get_default_memory_pool()
    from ilargi_sklearn._backend._namespace import asarray_on, device_of, to_numpy

    S = _sprand(5, 4, np.float64)
    dS = asarray_on(S, bk.compat, None, np.float32)
    if str(dS.dtype) != "float32" or device_of(dS) != d:
        raise AssertionError(f"asarray_on sparse: {dS.dtype}, {device_of(dS)}")
    _close(to_numpy(dS).toarray(), S.toarray(), np.float32, "asarray_on sparse")
    A = asarray_on(np.ones((2, 2)), bk.compat, d, np.float32)
    if type(A).__module__ != "cupy" or str(A.dtype) != "float32":
        raise AssertionError(f"asarray_on dense: {type(A)}, {A.dtype}")
    return {
        "detail": f"compute capability {d.compute_capability}; properties missing: "
        f"{missing or 'none'}; cupyx.scipy.sparse.linalg {linalg}",
        "name_gpu": props["name"].decode()
        if isinstance(props["name"], bytes)
        else str(props["name"]),
        "total_mem": int(props.get("totalGlobalMem", 0)),
        "pool_used_bytes": int(pool.used_bytes()),
    }


API_CHECKS = (
    api_add_at,
    api_scatter_add,
    api_take,
    api_indicator,
    api_csr_construct,
    api_sparse_ops,
    api_coo,
    api_linalg,
    api_compat,
    api_random,
    api_upload,
    api_device,
)


# ---------------------------------------------------------- phase 3: pytest
def run_pytest(rec: Recorder, budget: Budget, out_dir: Path, timeout: float) -> None:
    log = out_dir / "gpu_check_pytest.log"
    timeout = max(0.0, min(timeout, budget.left() - 60.0))
    if timeout < 20:
        rec.add("pytest", "tests/gpu", "skip", detail="time budget spent")
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gpu",
        "-q",
        "-rfEs",
        "-p",
        "no:cacheprovider",
        "-W",
        "default::DeprecationWarning",
        "-W",
        "default::FutureWarning",
    ]
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    seconds = time.perf_counter() - t0
    lines = log.read_text(errors="replace").splitlines()
    summary = next((ln for ln in reversed(lines) if " in " in ln), "")
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:40]
    if code is None:
        status, detail = "fail", f"killed after {timeout:.0f} s: {summary}"
    else:
        status = "ok" if code == 0 else "fail"
        detail = f"exit {code}: {summary.strip('= ')}"
    rec.add(
        "pytest",
        "tests/gpu",
        status,
        detail=detail,
        seconds=seconds,
        failures=failed,
        log=log.name,
    )


# --------------------------------------------------- phase 4: agree and time
def _star(
    n_rows: int,
    seed: int = 0,
    nonneg: bool = False,
    dim_rows: int = 10_000,
    dim_cols: int = 8,
):
    from ilargi_sklearn import MultiSourceDataset

    rng = np.random.default_rng(seed)
    draw = rng.random if nonneg else rng.standard_normal
    dim_rows = min(dim_rows, max(n_rows // 10, 10))
    sources = [draw((n_rows, 4))]
    indicators: list[Any] = [None]
    for _ in range(2):
        sources.append(draw((dim_rows, dim_cols)))
        indicators.append(rng.integers(0, dim_rows, n_rows))
    return MultiSourceDataset.from_matrices(sources, indicators)


def _timed(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up (kernel compilation, allocation), discarded
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _op_calls(op: Any, X: Any, Y: Any) -> dict[str, Callable[[], Any]]:
    return {
        "matmul": lambda: op.matmul(X),
        "rmatmul": lambda: op.rmatmul(Y),
        "gram": lambda: op.gram(format="dense"),
        "col_sums": lambda: op.col_sums(),
        "row_sq_norms": lambda: op.row_sq_norms(),
    }


def _estimators() -> list[tuple[str, Callable[..., Any], str | None, bool]]:
    """(name, factory, target, has strategy): fixed iteration counts so that the
    timings compare plans, not convergence."""
    from ilargi_sklearn.cluster import FactorizedKMeans
    from ilargi_sklearn.decomposition import FactorizedGNMF
    from ilargi_sklearn.linear_model import (
        FactorizedLinearRegression,
        FactorizedLogisticRegression,
    )
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler

    return [
        ("linear_regression", FactorizedLinearRegression, "y", True),
        (
            "logistic_regression",
            lambda **kw: FactorizedLogisticRegression(max_iter=20, tol=0.0, **kw),
            "labels",
            True,
        ),
        (
            "kmeans",
            lambda **kw: FactorizedKMeans(
                n_clusters=8, n_init=1, max_iter=10, tol=0.0, random_state=0, **kw
            ),
            None,
            True,
        ),
        (
            "gnmf",
            # The default init at this shape: "random" would time the host's
            # draw of the n x 8 starting W (1.8 s at 1e7 rows, the same stream
            # as scikit-learn's on both devices), not the updates.
            lambda **kw: FactorizedGNMF(
                n_components=8,
                init="nndsvda",
                max_iter=10,
                tol=0.0,
                random_state=0,
                **kw,
            ),
            None,
            True,
        ),
        ("standard_scaler", FactorizedStandardScaler, None, False),
    ]


#: Fitted attribute compared between the GPU and the CPU fit of each estimator.
_FITTED = {
    "linear_regression": "coef_",
    "logistic_regression": "coef_",
    "kmeans": "cluster_centers_",
    "gnmf": "components_",
    "standard_scaler": "scale_",
}


def _deviation(bk: Backend, got: Any, want: Any) -> float:
    """Largest deviation of ``got`` from ``want`` relative to ``max|want|``."""
    g, w = bk.dense(got), np.asarray(bk.dense(want), dtype=np.float64)
    if g.shape != w.shape:
        raise AssertionError(f"shape {g.shape} != {w.shape}")
    scale = max(1.0, float(np.max(np.abs(w))) if w.size else 1.0)
    return float(np.max(np.abs(g - w))) / scale if w.size else 0.0


#: Timing records in the planner's format (``ilargi_sklearn.planner.read_records``).
TRAINING_RECORDS_FILE = "gpu_records.jsonl"


def _training_record(
    est: Any,
    X_cpu: Any,
    y: Any,
    plan: str,
    device: str,
    seconds: float,
    n_rows: int,
    hardware: dict[str, Any],
) -> dict[str, Any] | None:
    """One fit's timing as a cost-model training record (None for estimators the
    planner does not plan): features from the CPU copy of the same data, the GPU's
    measured rates in the hardware part."""
    from ilargi_sklearn.planner._calibrate import RECORD_VERSION, _n_iter
    from ilargi_sklearn.planner._features import estimator_kind, plan_features
    from ilargi_sklearn.planner._hardware import machine_id

    kind = estimator_kind(est)
    if kind not in ("linear", "logistic", "kmeans", "gnmf"):
        return None
    features = plan_features(X_cpu, est, y, hardware=hardware)
    params = {k: v for k, v in est.get_params().items() if k in _PLANNED_PARAMS}
    workload = json.dumps(
        {"check": "gpu_check", "estimator": kind, "n_rows": n_rows, "params": params},
        sort_keys=True,
    )
    return {
        "version": RECORD_VERSION,
        "workload": workload,
        "group": "gpu_check",
        "estimator": kind,
        "params": params,
        "machine": machine_id(),
        "n_iter": _n_iter(est),
        "features": features,
        "time": time.time(),
        "plan": f"{plan}-{device}",
        "cached": False,
        "seconds": seconds,
    }


#: Estimator parameters recorded with a training record.
_PLANNED_PARAMS = ("n_clusters", "n_components", "max_iter", "solver", "C", "tol")


def run_timings(
    rec: Recorder,
    budget: Budget,
    bk: Backend,
    rows: list[int],
    repeats: int,
    train_path: Path | None = None,
) -> None:
    """Phase 4: each operator and estimator, factorized and materialized, GPU then
    CPU; the CPU record carries the GPU result's deviation from the CPU one."""
    estimators = _estimators()

    def no_sync() -> None:
        return None

    hw_cache: dict[str, Any] = {}

    def hardware() -> dict[str, Any]:
        # Measured once (and cached per machine by the planner).
        if not hw_cache:
            from ilargi_sklearn.planner._hardware import hardware_info

            hw_cache.update(hardware_info())
        return hw_cache

    # Seconds and rows of each case at the previous size: a case is skipped when
    # its time scaled linearly to this size would not fit in the budget left.
    last: dict[str, tuple[float, int]] = {}

    def reserve(key: str, n: int) -> float:
        seconds, n_prev = last.get(key, (0.0, 1))
        return seconds * n / n_prev

    for n in rows:
        data: dict[str, Any] = {}

        def build(n: int = n, data: dict = data) -> str:
            ds = _star(n)
            data["cpu"] = ds
            data["nonneg_cpu"] = _star(n, seed=1, nonneg=True)
            data["gpu"] = bk.move(ds)
            data["nonneg_gpu"] = bk.move(data["nonneg_cpu"])
            bk.sync()
            return f"{ds.shape[0]} x {ds.shape[1]}, 3 sources (2 dimensions)"

        if _run_case(rec, budget, "setup", "star", build, reserve=10, n_rows=n) is None:
            continue
        rng = np.random.default_rng(2)
        y = rng.standard_normal(n)
        X_host = rng.standard_normal((data["cpu"].shape[1], 4))
        Y_host = rng.standard_normal((n, 4))
        targets = {"y": y, "labels": (y > 0).astype(np.int64), None: None}
        for plan in ("factorized", "materialized"):
            ops: dict[str, Any] = {}
            for device in ("gpu", "cpu"):

                def make_op(
                    device: str = device,
                    plan: str = plan,
                    ops: dict = ops,
                    data: dict = data,
                ) -> str:
                    op = data[device].operator
                    ops[device] = op if plan == "factorized" else op.materialized()
                    bk.sync()
                    return f"{type(ops[device]).__name__}, {ops[device].nbytes} bytes"

                _run_case(
                    rec,
                    budget,
                    "setup",
                    f"operator {plan}",
                    make_op,
                    reserve=5,
                    device=device,
                    n_rows=n,
                )
            results: dict[tuple[str, str], Any] = {}
            for name in OPS:
                for device in ("gpu", "cpu"):
                    if device not in ops:
                        continue
                    on_gpu = device == "gpu"
                    Xd = bk.array(X_host) if on_gpu else X_host
                    Yd = bk.array(Y_host) if on_gpu else Y_host
                    fn = _op_calls(ops[device], Xd, Yd)[name]
                    sync = bk.sync if on_gpu else no_sync

                    def op_case(
                        fn: Callable = fn,
                        sync: Callable = sync,
                        key: tuple = (name, device),
                        results: dict = results,
                    ) -> dict[str, Any]:
                        results[key] = fn()
                        out = {"seconds_median": _timed(fn, sync, repeats)}
                        if key[1] == "cpu" and (key[0], "gpu") in results:
                            out["gpu_deviation"] = _deviation(
                                bk, results[(key[0], "gpu")], results[key]
                            )
                        return out

                    key = f"{name}/{device}/{plan}"
                    _run_case(
                        rec,
                        budget,
                        "time",
                        name,
                        op_case,
                        reserve=reserve(key, n),
                        kind="operator",
                        plan=plan,
                        device=device,
                        n_rows=n,
                    )
                    if rec.records[-1]["status"] == "ok":
                        last[key] = (rec.records[-1]["seconds"], n)
            results.clear()
            for name, make, target, has_strategy in estimators:
                if not has_strategy and plan == "materialized":
                    continue
                fitted: dict[str, Any] = {}
                for device in ("gpu", "cpu"):
                    on_gpu = device == "gpu"
                    X_fit = data[("nonneg_" if name == "gnmf" else "") + device]
                    yt = targets[target]
                    if yt is not None and on_gpu:
                        yt = bk.array(yt)
                    kw = {"strategy": plan} if has_strategy else {}

                    def fit_case(
                        make: Callable = make,
                        kw: dict = kw,
                        X_fit: Any = X_fit,
                        yt: Any = yt,
                        sync: Callable = bk.sync if on_gpu else no_sync,
                        device: str = device,
                        attr: str = _FITTED[name],
                        fitted: dict = fitted,
                        X_cpu: Any = data[
                            ("nonneg_" if name == "gnmf" else "") + "cpu"
                        ],
                        y_cpu: Any = targets[target],
                        plan: str = plan,
                        n: int = n,
                    ) -> dict[str, Any]:
                        est = make(**kw)
                        out = {
                            "seconds_median": _timed(
                                lambda: est.fit(X_fit, yt), sync, 1
                            )
                        }
                        if train_path is not None:
                            record = _training_record(
                                est,
                                X_cpu,
                                y_cpu,
                                plan,
                                device,
                                out["seconds_median"],
                                n,
                                hardware(),
                            )
                            if record is not None:
                                with train_path.open("a") as fh:
                                    fh.write(json.dumps(record) + "\n")
                        fitted[device] = getattr(est, attr)
                        if device == "cpu" and "gpu" in fitted:
                            out["gpu_deviation"] = _deviation(
                                bk, fitted["gpu"], fitted["cpu"]
                            )
                        return out

                    key = f"{name}/{device}/{plan}"
                    _run_case(
                        rec,
                        budget,
                        "time",
                        name,
                        fit_case,
                        reserve=reserve(key, n),
                        kind="estimator",
                        plan=plan,
                        device=device,
                        n_rows=n,
                    )
                    if rec.records[-1]["status"] == "ok":
                        last[key] = (rec.records[-1]["seconds"], n)
            ops.clear()
        data.clear()


# ----------------------------------------------------------------- the table
def _table(rec: Recorder, header: list[str]) -> str:
    lines = list(header)
    counts: dict[str, int] = {}
    for r in rec.records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for r in rec.records:
        if r["phase"] in ("env", "api", "pytest") or r["status"] in ("fail", "info"):
            if r["phase"] == "time" and r["status"] == "ok":
                continue
            lines.append(
                f"  [{r['status']:>4}] {r['phase']}/{r['name']}"
                + (
                    f" ({r.get('device', '')}, {r.get('plan', '')})"
                    if "plan" in r
                    else ""
                )
                + f": {r.get('detail', '')}"
                + (f" [at {r['where']}]" if r.get("where") else "")
            )
            for f in r.get("failures", []) or []:
                lines.append(f"         {f}")
    timed = [r for r in rec.records if r["phase"] == "time"]
    if timed:
        lines.append("")
        lines.append(
            f"{'name':<20}{'rows':>9} {'plan':<13}{'gpu s':>10}{'cpu s':>10}"
            f"{'cpu/gpu':>9}{'gpu dev':>10}"
        )
        keyed: dict[tuple, dict[str, Any]] = {}
        for r in timed:
            keyed.setdefault((r["name"], r["n_rows"], r["plan"]), {})[r["device"]] = r

        def cell(r: Any) -> str:
            if r is None:
                return f"{'-':>10}"
            if r["status"] != "ok":
                return f"{r['status']:>10}"
            return f"{r['seconds_median']:>10.4f}"

        for (name, n, plan), by_dev in keyed.items():
            g, c = by_dev.get("gpu"), by_dev.get("cpu")
            ok = g and c and g["status"] == "ok" and c["status"] == "ok"
            ratio = (
                f"{c['seconds_median'] / g['seconds_median']:>9.1f}" if ok else " " * 9
            )
            dev = c.get("gpu_deviation") if c else None
            dev_s = f"{dev:>10.1e}" if isinstance(dev, float) else " " * 10
            lines.append(f"{name:<20}{n:>9} {plan:<13}{cell(g)}{cell(c)}{ratio}{dev_s}")
    return "\n".join(lines)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in (
        "numpy",
        "scipy",
        "sklearn",
        "pandas",
        "array_api_compat",
        "cupy",
        "numba",
        "pytest",
        "hypothesis",
    ):
        if importlib.util.find_spec(mod) is None:
            out[mod] = "missing"
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[mod] = str(
                    getattr(importlib.import_module(mod), "__version__", "?")
                )
        except Exception as exc:  # noqa: BLE001
            out[mod] = f"import fails ({_err(exc)})"
    return out


# ------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="NumPy for CuPy")
    parser.add_argument(
        "--rows", type=float, nargs="+", default=None, help="target rows per size"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=250.0, help="seconds")
    parser.add_argument("--pytest-timeout", type=float, default=120.0)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument(
        "--watchdog",
        type=float,
        default=45.0,
        help="seconds past the budget after which a hung run is stopped (0: never)",
    )
    parser.add_argument("--out", default=None, help="output folder (default $OUT)")
    args = parser.parse_args(argv)
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        # The timed fits stop at fixed iteration counts on purpose.
        warnings.simplefilter("ignore", ConvergenceWarning)
        return _main(args)


def _phases(
    args: argparse.Namespace,
    rec: Recorder,
    budget: Budget,
    out_dir: Path,
    rows: list[int],
    made: list[Backend],
) -> None:
    """Phases 2 to 4 (the backend is appended to ``made`` once built)."""

    def make_backend() -> str:
        made.append(Backend(args.dry_run))
        return made[0].name

    # The backend and the api checks run whatever the budget (a few seconds).
    _run_case(rec, budget, "env", "backend", make_backend, reserve=-np.inf)
    bk = made[0] if made else None
    if bk is not None:
        for check in API_CHECKS:
            name = check.__name__.removeprefix("api_")
            _run_case(rec, budget, "api", name, lambda c=check: c(bk), reserve=-np.inf)
        print(f"api checks done ({budget.elapsed():.0f} s)", flush=True)
    if not args.skip_tests:
        run_pytest(rec, budget, out_dir, args.pytest_timeout)
        print(f"pytest done ({budget.elapsed():.0f} s)", flush=True)
    if bk is not None:
        run_timings(
            rec, budget, bk, rows, args.repeats, out_dir / TRAINING_RECORDS_FILE
        )


def _main(args: argparse.Namespace) -> int:
    budget = Budget(args.budget)
    rows = [int(r) for r in (args.rows or ([2_000] if args.dry_run else [1e6, 4e6]))]

    versions = _versions()
    try:
        from ilargi_sklearn._backend._gpu import probe_gpu
    except Exception as exc:  # noqa: BLE001 - the package itself does not import
        print(f"cannot import ilargi_sklearn: {_err(exc)}; versions: {versions}")
        print("missing pure-Python dependency? see 'How to run on a GPU machine'.")
        return 1
    usable, reason = probe_gpu()
    if not usable and not args.dry_run:
        print(f"no GPU: {reason}")
        return 0

    out_dir = Path(
        args.out or os.environ.get("OUT") or ROOT / "benchmarks/results/gpu_check"
    )
    rec = Recorder(out_dir / "gpu_check.jsonl")
    rec.add(
        "env",
        "versions",
        "info",
        detail=", ".join(f"{k} {v}" for k, v in versions.items()),
    )
    rec.add("env", "probe", "ok" if usable else "info", detail=reason)
    print(f"GPU: {reason}" if usable else f"dry run (no GPU: {reason})", flush=True)

    made: list[Backend] = []

    def finish(note: str = "") -> None:
        bk = made[0] if made else None
        what = reason if usable else f"DRY RUN ({bk.name if bk else 'no backend'})"
        header = [
            "",
            f"gpu_check: {what}",
            f"elapsed {budget.elapsed():.0f} s of a {budget.seconds:.0f} s budget"
            f"{note}; records in {rec.path}",
        ]
        table = _table(rec, header)
        (out_dir / "gpu_check_table.txt").write_text(table + "\n")
        print(table, flush=True)

    def abort() -> None:
        # A hung case: dump every thread's stack, print what was recorded, stop.
        faulthandler.dump_traceback(all_threads=True)
        rec.add("env", "watchdog", "fail", detail="run stopped: a case hung")
        finish(" (STOPPED BY THE WATCHDOG)")
        os._exit(3)

    watchdog = threading.Timer(budget.seconds + args.watchdog, abort)
    watchdog.daemon = True
    if args.watchdog > 0:
        watchdog.start()
    try:
        _phases(args, rec, budget, out_dir, rows, made)
    finally:
        watchdog.cancel()
    finish()
    return 1 if any(r["status"] == "fail" for r in rec.records) else 0


if __name__ == "__main__":
    sys.exit(main())
