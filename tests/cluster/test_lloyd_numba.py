"""K-Means' compiled steps (``cluster/_lloyd_numba.py``): equal to NumPy and scikit-learn, with fallback."""

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import dense, plant_compile_failure, tolerance
from sklearn.cluster import KMeans

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.cluster import FactorizedKMeans, _kmeans, _lloyd_fused, _lloyd_numba
from ilargi_sklearn.multisource import (
    AffineOperator,
)
from ilargi_sklearn.multisource._operators import fused_layout
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

numba = pytest.importorskip("numba")


# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


@pytest.fixture
def spy_fused(monkeypatch):
    """Count the runs of the compiled Lloyd loop (each ends in one ``keep``)."""
    calls = []
    original = _lloyd_fused._FusedLloyd.keep

    def spy(self, labels):
        calls.append(1)
        return original(self, labels)

    monkeypatch.setattr(_lloyd_fused._FusedLloyd, "keep", spy)
    return calls


# ------------------------------------------------------------------------ kernels
def _reference_assign(X0, o0, C0, idxs, P, offsets, pads, bias):
    acc = (X0 - o0) @ C0
    for idx, off, pad in zip(idxs, offsets, pads):
        acc += P[off + np.where(idx < 0, pad, idx)]
    partial = bias - 2.0 * acc
    return partial.argmin(axis=1), partial


# The M-step keeps its sums in registers for k <= 8 and a dense base of up to 12
# columns (d0 = 4), in memory otherwise (k = 11, d0 = 13, a CSR base).
@pytest.mark.parametrize("base", ["dense", "csr"])
@pytest.mark.parametrize("k", [3, 8, 11])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d0", [4, 13])
def test_assign_and_accumulate_match_numpy(k, dtype, base, d0):
    rng = np.random.default_rng(k)
    # 503 rows: the E-step's last step of four rows is partial (and the M-step's
    # of two).
    n, r = 503, 7
    X0 = rng.standard_normal((n, d0)).astype(dtype)
    o0 = rng.standard_normal(d0).astype(dtype)
    Xk = X0
    if base == "csr":
        # Some empty rows, no centering (a CSR source is never centered).
        X0[rng.random((n, d0)) < 0.6] = 0.0
        X0[:7] = 0.0
        o0[:] = 0.0
        Xk = sp.csr_matrix(X0)
    idxs = [rng.integers(-1, r, n), rng.integers(0, r + 3, n)]
    sizes = [r + 1, r + 4]
    offsets = np.array([0, sizes[0]])
    pads = np.array([r, r + 3])
    total = sum(sizes)
    kp = -(-k // 8) * 8
    C0 = np.zeros((d0, kp), dtype=dtype)
    C0[:, :k] = rng.standard_normal((d0, k))
    P = np.zeros((total, kp), dtype=dtype)
    P[:, :k] = rng.standard_normal((total, k))
    bias = np.full(kp, np.inf, dtype=dtype)
    bias[:k] = rng.random(k)
    labels = np.empty(n, dtype=np.int32)
    best = np.empty(n, dtype=dtype)
    nb = kp // 8
    _lloyd_numba.fused_assign(
        Xk,
        o0,
        np.ascontiguousarray(C0.reshape(d0, nb, 8).transpose(1, 0, 2)),
        idxs,
        P.reshape(total, nb, 8),
        offsets,
        pads,
        bias.reshape(nb, 8),
        labels,
        best,
    )
    ref_labels, partial = _reference_assign(
        X0.astype(float), o0, C0[:, :k], idxs, P[:, :k], offsets, pads, bias[:k]
    )
    np.testing.assert_array_equal(labels, ref_labels)
    tol = tolerance(dtype, "compiled")
    scale = np.abs(partial).max()
    np.testing.assert_allclose(best, partial.min(axis=1), atol=tol * scale)

    at = np.empty(n, dtype=dtype)
    given = rng.integers(0, k, n).astype(np.int32)
    _lloyd_numba.fused_partial_at(Xk, o0, C0, idxs, P, offsets, pads, bias, given, at)
    np.testing.assert_allclose(at, partial[np.arange(n), given], atol=tol * scale)

    w = rng.random(n)
    wsum, sums0, cnt = _lloyd_numba.fused_accumulate(
        Xk, o0, idxs, offsets, pads, w, labels, k, total
    )
    np.testing.assert_allclose(wsum, np.bincount(labels, w, minlength=k))
    ref_sums0 = np.zeros((k, d0))
    np.add.at(ref_sums0, labels, w[:, None] * (X0 - o0))
    np.testing.assert_allclose(sums0, ref_sums0, rtol=tol, atol=tol)
    ref_cnt = np.zeros((total, k))
    for idx, off, pad in zip(idxs, offsets, pads):
        np.add.at(ref_cnt, (off + np.where(idx < 0, pad, idx), labels), w)
    np.testing.assert_allclose(cnt, ref_cnt, rtol=1e-12)


@pytest.mark.parametrize("base", ["dense", "csr"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_assign_ties_take_the_first_center(dtype, base):
    # Exact ties (duplicated centers, in one block of 8 and across blocks) go to
    # the first center, as np.argmin; padding centers (bias inf) are never taken.
    rng = np.random.default_rng(5)
    n, d0, r, k = 400, 3, 5, 19
    X0 = rng.standard_normal((n, d0)).astype(dtype)
    o0 = np.zeros(d0, dtype=dtype)
    Xk = X0
    if base == "csr":
        X0[rng.random((n, d0)) < 0.5] = 0.0
        Xk = sp.csr_matrix(X0)
    idxs = [rng.integers(-1, r, n)]
    offsets, pads = np.array([0]), np.array([r])
    kp = 24
    C0 = np.zeros((d0, kp), dtype=dtype)
    P = np.zeros((r + 1, kp), dtype=dtype)
    bias = np.full(kp, np.inf, dtype=dtype)
    # Three distinct centers, copied: j -> (j, j + 3, j + 9, j + 15).
    C0[:, :3] = rng.standard_normal((d0, 3))
    P[:, :3] = rng.standard_normal((r + 1, 3))
    bias[:3] = rng.random(3)
    for shift in (3, 9, 15):
        C0[:, shift : shift + 3] = C0[:, :3]
        P[:, shift : shift + 3] = P[:, :3]
        bias[shift : shift + 3] = bias[:3]
    bias[6:9] = np.inf  # padding-like centers inside the range
    labels = np.empty(n, dtype=np.int32)
    best = np.empty(n, dtype=dtype)
    nb = kp // 8
    _lloyd_numba.fused_assign(
        Xk,
        o0,
        np.ascontiguousarray(C0.reshape(d0, nb, 8).transpose(1, 0, 2)),
        idxs,
        P.reshape(r + 1, nb, 8),
        offsets,
        pads,
        bias.reshape(nb, 8),
        labels,
        best,
    )
    ref_labels, partial = _reference_assign(
        X0.astype(float), o0, C0[:, :k], idxs, P[:, :k], offsets, pads, bias[:k]
    )
    assert set(np.unique(labels)) <= {0, 1, 2}
    np.testing.assert_array_equal(labels, ref_labels)
    scale = np.abs(partial[np.isfinite(partial)]).max()
    np.testing.assert_allclose(
        best, partial.min(axis=1), atol=tolerance(dtype, "compiled") * scale
    )


def test_csr_base_cannot_be_centered():
    X0 = sp.csr_matrix(np.eye(3))
    o0 = np.array([0.0, 0.5, 0.0])
    idxs, offsets, pads = [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    with pytest.raises(ValueError, match=r"o0 must be zero.*columns \[1\]"):
        _lloyd_numba.fused_accumulate(
            X0, o0, idxs, offsets, pads, np.ones(3), np.zeros(3, np.int32), 1, 0
        )


def test_two_chunks_equal_one_chunk(monkeypatch):
    ds = random_dataset(3, n_rows=9000, scenario="left")
    init = dense(ds)[:5]
    one = FactorizedKMeans(5, init=init, max_iter=5).fit(ds)
    monkeypatch.setattr(_launcher, "n_threads", lambda: 2)
    two = FactorizedKMeans(5, init=init, max_iter=5).fit(ds)
    np.testing.assert_array_equal(one.labels_, two.labels_)
    np.testing.assert_allclose(one.cluster_centers_, two.cluster_centers_, rtol=1e-10)
    np.testing.assert_allclose(one.inertia_, two.inertia_, rtol=1e-10)


# ---------------------------------------------------------- KMeans: both paths
def _fit_both(ds, monkeypatch, **kw):
    fused = FactorizedKMeans(**kw).fit(ds)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        plain = FactorizedKMeans(**kw).fit(ds)
    return fused, plain


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kmeans_compiled_equals_numpy_and_sklearn(scenario, monkeypatch, spy_fused):
    ds = random_dataset(2, n_rows=200, scenario=scenario)
    X = dense(ds)
    init = X[np.random.default_rng(0).choice(X.shape[0], 6, replace=False)]
    sw = np.random.default_rng(1).random(X.shape[0]) + 0.5
    fused = FactorizedKMeans(6, init=init).fit(ds, sample_weight=sw)
    assert len(spy_fused) == 1
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        plain = FactorizedKMeans(6, init=init).fit(ds, sample_weight=sw)
    assert len(spy_fused) == 1
    ref = KMeans(6, init=init, n_init=1, algorithm="lloyd").fit(X, sample_weight=sw)
    tol = tolerance(X.dtype, "compiled")
    for other in (plain, ref):
        np.testing.assert_array_equal(fused.labels_, other.labels_)
        scale = np.abs(other.cluster_centers_).max()
        np.testing.assert_allclose(
            fused.cluster_centers_, other.cluster_centers_, atol=tol * scale
        )
        np.testing.assert_allclose(fused.inertia_, other.inertia_, rtol=tol)
        assert fused.n_iter_ == other.n_iter_


@pytest.mark.parametrize("scenario", ["left", "sparse", "float32"])
def test_kmeans_compiled_unit_weights(scenario, spy_fused):
    # No sample_weight: the M-step reads no weights and the inertia's column
    # sums of squares use the cached counts; the fit is the one with explicit
    # unit weights (the same sums: w * x with w = 1 is x).
    ds = random_dataset(4, n_rows=300, scenario=scenario)
    X = dense(ds)
    init = X[np.random.default_rng(2).choice(X.shape[0], 5, replace=False)]
    plain = FactorizedKMeans(5, init=init).fit(ds)
    ones = FactorizedKMeans(5, init=init).fit(ds, sample_weight=np.ones(X.shape[0]))
    assert len(spy_fused) == 2
    np.testing.assert_array_equal(plain.labels_, ones.labels_)
    np.testing.assert_array_equal(plain.cluster_centers_, ones.cluster_centers_)
    np.testing.assert_allclose(plain.inertia_, ones.inertia_, rtol=1e-12)
    ref = KMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X)
    np.testing.assert_array_equal(plain.labels_, ref.labels_)
    np.testing.assert_allclose(
        plain.inertia_, ref.inertia_, rtol=tolerance(X.dtype, "compiled")
    )


def test_kmeans_compiled_relocates_empty_clusters(spy_fused):
    rng = np.random.default_rng(0)
    base = rng.random((120, 2))
    dim = rng.random((10, 2))
    fk = rng.integers(0, 10, 120)
    ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    X = dense(ds)
    init = np.vstack([X[:2], np.full((2, 4), 50.0)])
    ours = FactorizedKMeans(4, init=init, max_iter=1).fit(ds)
    ref = KMeans(4, init=init, n_init=1, max_iter=1).fit(X)
    assert spy_fused
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-9)
    assert np.unique(ours.labels_).shape[0] == 4


def test_kmeans_compiled_on_scaled_data(monkeypatch):
    # A scaled and centered operator (AffineOperator) under the implicit centering.
    ds = random_dataset(4, n_rows=150, scenario="outer")
    op = ds.operator
    scale = np.linspace(0.5, 2.0, op.n_cols)
    scaled = AffineOperator(op, scale=scale, offset=np.full(op.n_cols, 0.3))
    X = scaled.materialize("dense")
    init = X[:5]
    seen = []
    original = _kmeans.fused_lloyd_plan

    def plan(fit_op, k):
        out = original(fit_op, k)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(_kmeans, "fused_lloyd_plan", plan)
    monkeypatch.setattr(_kmeans, "validate_X", lambda *a, **k: scaled)
    ours = FactorizedKMeans(5, init=init).fit(X)
    ref = KMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X)
    assert seen == [True]
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-9)


@pytest.mark.parametrize("scenario", ["star", "outer", "float32"])
def test_kmeans_predict_and_score_compiled_equal_numpy(scenario, monkeypatch):
    ds = random_dataset(5, n_rows=150, scenario=scenario)
    fused, plain = _fit_both(ds, monkeypatch, n_clusters=4, random_state=0)
    np.testing.assert_array_equal(fused.labels_, plain.labels_)
    other = ds[np.arange(0, ds.shape[0], 3)]
    labels, score = fused.predict(other), fused.score(other)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        np.testing.assert_array_equal(labels, fused.predict(other))
        np.testing.assert_allclose(
            score, fused.score(other), rtol=tolerance(ds.dtype, "compiled")
        )
    np.testing.assert_array_equal(labels, fused.labels_[::3])


# ------------------------------------------------------ KMeans: sparse sources
def _sparse_source(rng, r, c, dtype):
    S = sp.random(r, c, density=0.3, random_state=rng, format="csr", dtype=dtype)
    S.data = rng.standard_normal(S.data.shape[0]).astype(dtype)
    return S


def _sparse_dataset(seed, base, dtype=np.float64, n_rows=400, base_cols=3):
    """CSR dimension tables with unmatched rows (-1), a CSR, dense or no base."""
    rng = np.random.default_rng(seed)
    sources, indicators = [], []
    if base == "csr":
        sources.append(_sparse_source(rng, n_rows, base_cols, dtype))
        indicators.append(None)
    elif base == "dense":
        sources.append(rng.standard_normal((n_rows, base_cols)).astype(dtype))
        indicators.append(None)
    for r, c in [(13, 5), (31, 3)]:
        sources.append(_sparse_source(rng, r, c, dtype))
        idx = rng.integers(0, r, n_rows)
        idx[rng.random(n_rows) < 0.2] = -1
        indicators.append(idx)
    # A dense dimension table next to the CSR ones.
    sources.append(rng.standard_normal((9, 2)).astype(dtype))
    indicators.append(rng.integers(0, 9, n_rows))
    return MultiSourceDataset.from_matrices(sources, indicators, dtype=dtype)


@pytest.mark.parametrize(
    ("base", "dtype", "k"),
    [
        ("csr", np.float64, 6),
        ("csr", np.float64, 11),
        ("csr", np.float32, 6),
        ("dense", np.float64, 6),
        ("dense", np.float32, 11),
        (None, np.float64, 6),
    ],
)
def test_kmeans_sparse_sources_equal_sklearn_and_numpy(
    base, dtype, k, monkeypatch, spy_fused
):
    ds = _sparse_dataset(k, base, dtype)
    X = sp.csr_matrix(ds.materialize("sparse"))
    assert X.dtype == dtype
    rng = np.random.default_rng(0)
    init = X[rng.choice(X.shape[0], k, replace=False)].toarray()
    sw = rng.random(X.shape[0]) + 0.5
    fused = FactorizedKMeans(k, init=init).fit(ds, sample_weight=sw)
    assert len(spy_fused) == 1
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        plain = FactorizedKMeans(k, init=init).fit(ds, sample_weight=sw)
    assert len(spy_fused) == 1
    ref = KMeans(k, init=init, n_init=1, algorithm="lloyd").fit(X, sample_weight=sw)
    tol = tolerance(dtype, "operator")
    for other in (plain, ref):
        np.testing.assert_array_equal(fused.labels_, other.labels_)
        scale = np.abs(other.cluster_centers_).max()
        np.testing.assert_allclose(
            fused.cluster_centers_, other.cluster_centers_, atol=tol * scale
        )
        np.testing.assert_allclose(fused.inertia_, other.inertia_, rtol=tol * 10)
        assert fused.n_iter_ == other.n_iter_
    assert fused.cluster_centers_.dtype == dtype
    # predict / score on other rows: the compiled E-step equals the NumPy one.
    rows = ds[np.arange(0, ds.shape[0], 3)]
    labels, score = fused.predict(rows), fused.score(rows)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        np.testing.assert_array_equal(labels, fused.predict(rows))
        np.testing.assert_allclose(
            score, fused.score(rows), rtol=tolerance(dtype, "compiled")
        )
    np.testing.assert_array_equal(labels, ref.predict(X[::3]))


def test_kmeans_wide_csr_base_goes_through_a_table(monkeypatch, spy_fused):
    # A CSR base wider than the inline limit is multiplied by SciPy into a table.
    monkeypatch.setattr(_lloyd_fused, "_INLINE_MAX_SPARSE_COLS", 2)
    ds = _sparse_dataset(3, "csr", base_cols=5)
    layout = fused_layout(ds.operator)
    assert sp.issparse(layout.base) and layout.base.shape[1] == 5
    X = sp.csr_matrix(ds.materialize("sparse"))
    init = X[:4].toarray()
    fused = _lloyd_fused._FusedLloyd(layout, 4)
    assert fused.X0.shape[1] == 0 and sp.issparse(fused.tables[0])
    ours = FactorizedKMeans(4, init=init).fit(ds)
    ref = KMeans(4, init=init, n_init=1, algorithm="lloyd").fit(X)
    assert len(spy_fused) == 1
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    scale = np.abs(ref.cluster_centers_).max()
    np.testing.assert_allclose(
        ours.cluster_centers_, ref.cluster_centers_, atol=1e-10 * scale
    )


def test_without_numba_the_numpy_path_runs():
    code = (
        "import sys\n"
        "sys.modules['numba'] = None  # import numba raises ImportError\n"
        "import numpy as np\n"
        "from ilargi_sklearn._backend import _launcher\n"
        "from ilargi_sklearn.cluster import FactorizedKMeans\n"
        "from ilargi_sklearn.utils._testing import random_dataset\n"
        "ds = random_dataset(0, n_rows=100, scenario='star')\n"
        "km = FactorizedKMeans(3, random_state=0).fit(ds)\n"
        "print(_launcher.numba_available(), np.unique(km.labels_).size)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "3"]


def test_compile_failure_falls_back_to_numpy(monkeypatch, caplog):
    # numba installed but unable to compile: one warning, the kernels are
    # disabled for the process, and the fit is the NumPy path's.
    monkeypatch.delenv(_launcher.NO_NUMBA_ENV, raising=False)
    ds = random_dataset(3, scenario="star", n_rows=300)
    kw = dict(n_clusters=4, n_init=2, random_state=0)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedKMeans(**kw).fit(ds)

    plant_compile_failure(monkeypatch)
    with caplog.at_level("WARNING", logger=_launcher.__name__):
        est = FactorizedKMeans(**kw).fit(ds)
    assert "could not compile" in caplog.text
    assert not _launcher.numba_available()
    np.testing.assert_array_equal(est.labels_, ref.labels_)
    np.testing.assert_allclose(est.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    np.testing.assert_array_equal(est.predict(ds), ref.predict(ds))
    # Errors that are not compile failures still surface.
    monkeypatch.setitem(_launcher._state, "numba", numba)

    def failing(*args):
        raise ValueError("not a compile failure")

    monkeypatch.setattr(_launcher, "_kernel", lambda name: failing)
    with pytest.raises(ValueError, match="not a compile failure"):
        FactorizedKMeans(**kw).fit(ds)


def test_the_kernel_runs_the_generic_steps_where_the_compiled_ones_fail(monkeypatch):
    # The steps never run the kernel: the kernel catches the compiled steps'
    # compile failure (here at the first M-step) in one place, and the run is
    # the generic steps' from the start, row norms and all.
    ds = random_dataset(3, scenario="star", n_rows=200)
    op = ds.operator
    init = dense(ds)[:4].copy()
    sw = np.ones(op.n_rows)
    steps = _kmeans._lloyd_steps(op, 4)
    assert steps.compiled
    failures = []

    def broken(self, *args):
        failures.append(1)
        raise _launcher.CompiledUnavailable("planted compile failure")

    monkeypatch.setattr(_lloyd_fused._FusedLloyd, "center_sums", broken)
    got = _kmeans._kmeans_single_lloyd(
        op, sw, init, None, 20, 0.0, steps=steps, unit_weights=True
    )
    ref = _kmeans._kmeans_single_lloyd(
        op,
        sw,
        init,
        _kmeans._row_sq_norms(op),
        20,
        0.0,
        steps=_kmeans._LloydSteps(op, 4),
        unit_weights=True,
    )
    assert failures == [1]
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[2], ref[2])
    assert got[1] == ref[1] and got[3] == ref[3]


def test_accumulate_alone_in_a_fresh_process(tmp_path):
    # The M-step kernel uses the vector intrinsics too: called before any E-step
    # it defines them itself (no compile failure, no fallback warning). An empty
    # numba cache, so that the kernel compiles here.
    code = (
        "import logging, numpy as np\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from ilargi_sklearn._backend import _launcher as c\n"
        "from ilargi_sklearn.cluster._lloyd_numba import fused_accumulate\n"
        "rng = np.random.default_rng(0)\n"
        "X0 = rng.random((101, 3)); lab = rng.integers(0, 4, 101).astype(np.int32)\n"
        "w, s, _ = fused_accumulate(X0, np.zeros(3), [], np.zeros(0, np.int64),"
        " np.zeros(0, np.int64), None, lab, 4, 0)\n"
        "ref = np.zeros((4, 3)); np.add.at(ref, lab, X0)\n"
        "print(np.allclose(s, ref), np.allclose(w, np.bincount(lab, minlength=4)),"
        " c.numba_available())\n"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop(_launcher.NO_NUMBA_ENV, None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert out.stdout.split() == ["True", "True", "True"], out.stdout + out.stderr
    assert "could not compile" not in out.stderr
