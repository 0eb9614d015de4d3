"""FactorizedKMeans: parity with scikit-learn, factorized == materialized, bad input."""

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import dense, tolerance
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.cluster._kmeans import (
    _average_centers,
    _kmeans_plusplus,
    _labels_inertia,
    _lloyd_steps,
    _LloydSteps,
)
from ilargi_sklearn.cluster._lloyd_fused import _FusedLloyd
from ilargi_sklearn.multisource import FactorizedMatrix, MatrixOperator
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


def _init_centers(X, k, seed=0):
    rng = np.random.default_rng(seed)
    return dense(X[rng.choice(X.shape[0], k, replace=False)])


def _assert_same_fit(ours, ref, dtype=np.float64):
    rtol = tolerance(dtype, "fit")
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    scale = np.abs(ref.cluster_centers_).max()
    np.testing.assert_allclose(
        ours.cluster_centers_, ref.cluster_centers_, rtol=rtol, atol=rtol * scale
    )
    np.testing.assert_allclose(ours.inertia_, ref.inertia_, rtol=rtol)
    assert ours.n_iter_ == ref.n_iter_


# ------------------------------------------------------------ parity with sklearn
@pytest.mark.parametrize("fmt", ["dense", "sparse"])
@pytest.mark.parametrize("weighted", [False, True])
def test_same_init_matches_sklearn_on_arrays(fmt, weighted):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 6)) + 3.0
    if fmt == "sparse":
        X = sp.random(300, 6, density=0.4, random_state=1, format="csr")
    sw = rng.random(300) + 0.5 if weighted else None
    init = _init_centers(X, 5)
    ours = FactorizedKMeans(5, init=init, n_init=1).fit(X, sample_weight=sw)
    ref = KMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X, sample_weight=sw)
    _assert_same_fit(ours, ref)
    assert ours.labels_.dtype == ref.labels_.dtype


@pytest.mark.parametrize("scenario", ["star", "left", "sparse", "many_to_many"])
@pytest.mark.parametrize("strategy", ["factorized", "materialized"])
def test_same_init_matches_sklearn_on_datasets(scenario, strategy):
    ds = random_dataset(1, n_rows=200, scenario=scenario)
    X = ds.materialize()
    sw = np.random.default_rng(2).random(len(ds)) + 0.1
    init = _init_centers(X, 4, seed=3)
    ours = FactorizedKMeans(4, init=init, strategy=strategy).fit(ds, sample_weight=sw)
    ref = KMeans(4, init=init, n_init=1, algorithm="lloyd").fit(X, sample_weight=sw)
    _assert_same_fit(ours, ref)
    np.testing.assert_array_equal(ours.predict(ds), ref.predict(X))
    np.testing.assert_allclose(
        ours.transform(ds), ref.transform(X), rtol=1e-8, atol=1e-10
    )
    np.testing.assert_allclose(ours.score(ds), ref.score(X), rtol=1e-8)


@pytest.mark.parametrize("init", ["k-means++", "random"])
@pytest.mark.parametrize("scenario", ["outer", "sparse"])
def test_seeded_init_matches_sklearn(init, scenario):
    # k-means++ and random seeding draw the same random numbers as scikit-learn,
    # so a seeded fit (n_init runs included) reproduces it.
    ds = random_dataset(4, n_rows=150, scenario=scenario)
    X = ds.materialize()
    sw = np.random.default_rng(5).random(len(ds)) + 0.5
    ours = FactorizedKMeans(5, init=init, n_init=3, random_state=7).fit(
        ds, sample_weight=sw
    )
    ref = KMeans(5, init=init, n_init=3, random_state=7).fit(X, sample_weight=sw)
    _assert_same_fit(ours, ref)


def test_tol_convergence_and_max_iter_match_sklearn():
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.standard_normal((100, 3)) + c for c in (0, 4, 8)])
    init = _init_centers(X, 6, seed=1)
    for tol, max_iter in ((1e-1, 300), (0.0, 300), (1e-4, 2)):
        ours = FactorizedKMeans(6, init=init, tol=tol, max_iter=max_iter).fit(X)
        ref = KMeans(6, init=init, n_init=1, tol=tol, max_iter=max_iter).fit(X)
        _assert_same_fit(ours, ref)


@pytest.mark.parametrize("fmt", ["dense", "sparse"])
def test_empty_cluster_relocation_matches_sklearn(fmt):
    rng = np.random.default_rng(0)
    X = rng.random((80, 3))
    X = sp.csr_matrix(X) if fmt == "sparse" else X
    # Two centers far from every row start empty and are relocated to far rows.
    init = np.array([[0.5, 0.5, 0.5], [0.2, 0.8, 0.1], [50.0, 50.0, 50.0], [-40, 0, 9]])
    ours = FactorizedKMeans(4, init=init, max_iter=1).fit(X)
    ref = KMeans(4, init=init, n_init=1, max_iter=1).fit(X)
    _assert_same_fit(ours, ref)
    assert np.unique(ours.labels_).shape[0] == 4


def test_duplicate_points_warn_like_sklearn():
    X = np.repeat(np.array([[0.0, 1.0], [2.0, 3.0]]), 5, axis=0)
    with pytest.warns(ConvergenceWarning, match=r"distinct clusters \(2\)"):
        km = FactorizedKMeans(3, random_state=0).fit(X)
    assert np.unique(km.labels_).shape[0] == 2
    np.testing.assert_allclose(km.inertia_, 0.0, atol=1e-12)


def test_assignment_is_row_wise():
    # Pitfall 2 of DESIGN.md 8: a global minimum would put every row in one cluster.
    X = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0], [9.1, 9.0]])
    op = MatrixOperator(X)
    centers = np.array([[0.0, 0.0], [9.0, 9.0]])
    labels, inertia = _labels_inertia(op, np.ones(4), centers)
    np.testing.assert_array_equal(labels, [0, 0, 1, 1])
    # The expanded ||x||^2 - 2 x.c + ||c||^2 loses digits to ||x||^2 ~ 160.
    np.testing.assert_allclose(inertia, 0.02, rtol=1e-9)


# -------------------------------------------------- factorized == materialized
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_factorized_equals_materialized(scenario):
    ds = random_dataset(11, n_rows=120, scenario=scenario)
    rtol = tolerance(ds.dtype, "fit")
    sw = (np.random.default_rng(0).random(len(ds)) + 0.5).astype(ds.dtype)
    init = _init_centers(ds.materialize(), 4, seed=2)
    fits = {
        s: FactorizedKMeans(4, init=init, strategy=s).fit(ds, sample_weight=sw)
        for s in ("factorized", "materialized")
    }
    f, m = fits["factorized"], fits["materialized"]
    np.testing.assert_array_equal(f.labels_, m.labels_)
    np.testing.assert_allclose(
        f.cluster_centers_, m.cluster_centers_, rtol=rtol, atol=rtol
    )
    np.testing.assert_allclose(f.inertia_, m.inertia_, rtol=rtol)
    assert f.cluster_centers_.dtype == ds.dtype
    np.testing.assert_array_equal(f.predict(ds), m.predict(ds))
    np.testing.assert_allclose(f.transform(ds), m.transform(ds), rtol=rtol, atol=rtol)
    # A seeded k-means++ fit agrees as well.
    a = FactorizedKMeans(3, random_state=0).fit(ds)
    b = FactorizedKMeans(3, random_state=0, strategy="materialized").fit(ds)
    np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=rtol)


def test_factorized_fit_extracts_only_a_few_rows(monkeypatch):
    ds = random_dataset(0, n_rows=400, scenario="star")
    original = FactorizedMatrix.materialize
    extracted = []

    def guarded(self, format="auto"):
        extracted.append(self.n_rows)
        assert self.n_rows <= 10, "the factorized fit built the joined matrix"
        return original(self, format)

    monkeypatch.setattr(FactorizedMatrix, "materialize", guarded)
    km = FactorizedKMeans(6, random_state=0).fit(ds)
    assert extracted and km.labels_.shape == (400,)


def test_kernels_take_operators():
    ds = random_dataset(2, n_rows=90, scenario="left")
    X = ds.materialize()
    op, mop = ds.operator, MatrixOperator(X)
    rs = np.random.RandomState
    sw = np.ones(len(ds))
    c1, i1 = _kmeans_plusplus(op, 3, op.row_sq_norms(), sw, rs(0))
    c2, i2 = _kmeans_plusplus(mop, 3, mop.row_sq_norms(), sw, rs(0))
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(c1, X[i1], rtol=1e-12)
    # One E-step and M-step of each operator's Lloyd steps.
    (l1, n1), (l2, n2) = (_lloyd_iteration(o, sw, c) for o, c in ((op, c1), (mop, c2)))
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_allclose(n1, n2, rtol=1e-10, atol=1e-12)
    for j in range(3):
        np.testing.assert_allclose(
            n1[j], X[l1 == j].mean(axis=0), rtol=1e-10, atol=1e-12
        )


def _lloyd_iteration(op, sw, centers):
    steps = _lloyd_steps(op, centers.shape[0])
    labels = steps.assign(centers)
    sums, weights = steps.center_sums(labels, steps.weights(sw, False), centers.dtype)
    _average_centers(sums, weights)
    return labels, sums


def test_lloyd_steps_are_chosen_by_operator_and_numba(monkeypatch):
    # The compiled steps for a NumPy factorized matrix when numba runs; the
    # generic ones for a plain matrix and with the compiled kernels off.
    pytest.importorskip("numba")
    op = random_dataset(0, n_rows=50, scenario="star").operator
    monkeypatch.delenv("ILARGI_SKLEARN_NO_NUMBA", raising=False)
    assert isinstance(_lloyd_steps(op, 3), _FusedLloyd)
    assert isinstance(_lloyd_steps(op.materialized(), 3), _LloydSteps)
    monkeypatch.setenv("ILARGI_SKLEARN_NO_NUMBA", "1")
    assert isinstance(_lloyd_steps(op, 3), _LloydSteps)


# --------------------------------------------------------------- array inputs
def test_dense_and_sparse_arrays_agree():
    X = sp.random(120, 5, density=0.5, random_state=0, format="csr")
    init = _init_centers(X, 3)
    a = FactorizedKMeans(3, init=init).fit(X)
    b = FactorizedKMeans(3, init=init).fit(X.toarray())
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(
        a.cluster_centers_, b.cluster_centers_, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-10)


def test_fit_predict_and_fit_transform_are_consistent():
    ds = random_dataset(5, n_rows=100, scenario="snowflake")
    km = FactorizedKMeans(3, random_state=1)
    labels = km.fit_predict(ds)
    np.testing.assert_array_equal(labels, km.labels_)
    np.testing.assert_array_equal(km.predict(ds), labels)
    D = clone(km).fit_transform(ds)
    assert D.shape == (100, 3)
    np.testing.assert_allclose(D, km.transform(ds), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(D.argmin(axis=1), labels)
    np.testing.assert_allclose(-km.score(ds), km.inertia_, rtol=1e-10)
    np.testing.assert_allclose((D.min(axis=1) ** 2).sum(), km.inertia_, rtol=1e-8)
    names = km.get_feature_names_out()
    assert list(names) == [
        "factorizedkmeans0",
        "factorizedkmeans1",
        "factorizedkmeans2",
    ]


# ------------------------------------------------------------------ bad input
def test_fewer_samples_than_clusters():
    ds = random_dataset(0, n_rows=5, scenario="star")
    with pytest.raises(ValueError, match=r"n_samples=5 should be >= n_clusters=8"):
        FactorizedKMeans().fit(ds)
    with pytest.raises(ValueError, match=r"n_samples=3 should be >= n_clusters=4"):
        FactorizedKMeans(4).fit(np.ones((3, 2)))


def test_not_fitted():
    ds = random_dataset(0, n_rows=30)
    for method in ("predict", "transform", "score"):
        with pytest.raises(NotFittedError):
            getattr(FactorizedKMeans(2), method)(ds)


def test_wrong_feature_count():
    ds = random_dataset(0, n_rows=40, scenario="star")
    km = FactorizedKMeans(2, random_state=0).fit(ds)
    other = random_dataset(0, n_rows=40, scenario="star", n_sources=4)
    assert other.shape[1] != ds.shape[1]
    with pytest.raises(ValueError, match=f"is expecting {ds.shape[1]} features"):
        km.predict(other)
    X = np.ones((10, 3))
    km = FactorizedKMeans(2, random_state=0).fit(X + np.arange(10)[:, None])
    with pytest.raises(ValueError, match="is expecting 3 features"):
        km.transform(np.ones((3, 4)))
    with pytest.raises(ValueError, match="does not match the number of features"):
        FactorizedKMeans(2, init=np.ones((2, ds.shape[1] + 1))).fit(ds)
    with pytest.raises(ValueError, match="does not match the number of clusters"):
        FactorizedKMeans(3, init=np.ones((2, ds.shape[1]))).fit(ds)


def test_array_init_with_n_init_warns():
    X = np.random.default_rng(0).random((20, 2))
    with pytest.warns(RuntimeWarning, match="performing only one init"):
        FactorizedKMeans(2, init=X[:2], n_init=3).fit(X)


def test_inputs_unchanged():
    ds = random_dataset(3, n_rows=80, scenario="outer")
    before = ds.materialize("dense").copy()
    X = np.random.default_rng(0).random((50, 3)) + 5.0
    X_before = X.copy()
    init = X[:3].copy()
    sw = np.linspace(0.5, 2.0, 50)
    sw_before = sw.copy()
    FactorizedKMeans(3, init=init).fit(X, sample_weight=sw)
    FactorizedKMeans(3, random_state=0).fit(ds).transform(ds)
    np.testing.assert_array_equal(X, X_before)
    np.testing.assert_array_equal(init, X_before[:3])
    np.testing.assert_array_equal(sw, sw_before)
    np.testing.assert_array_equal(ds.materialize("dense"), before)
