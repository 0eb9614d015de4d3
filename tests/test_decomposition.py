"""FactorizedGNMF: parity with scikit-learn's NMF (mu, Frobenius), factorized ==
materialized, bad input."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.decomposition import NMF
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils.estimator_checks import check_estimator

from ilargi_sklearn.dataset import FactorizedMatrix, MatrixOperator
from ilargi_sklearn.decomposition import FactorizedGNMF
from ilargi_sklearn.decomposition._gnmf import _frobenius_error, _randomized_svd
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


def _rtol(dtype):
    return 1e-6 if np.dtype(dtype) == np.float64 else 1e-3


def _dense(A):
    return A.toarray() if sp.issparse(A) else np.asarray(A)


def _init(n, m, k, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, k)).astype(dtype), rng.random((k, m)).astype(dtype)


def _assert_rel_close(actual, expected, rtol, what):
    err = np.abs(
        np.asarray(actual, np.float64) - np.asarray(expected, np.float64)
    ).max()
    scale = np.abs(np.asarray(expected, np.float64)).max()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"


def _sk_nmf(k, **kw):
    return NMF(k, solver="mu", beta_loss="frobenius", **kw)


@pytest.fixture(autouse=True)
def _no_convergence_warnings():
    # Short fixed-iteration fits are the point of most tests here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


# ------------------------------------------------------------ parity with sklearn
@pytest.mark.parametrize("fmt", ["dense", "sparse"])
@pytest.mark.parametrize("tol", [0.0, 1e-3])
def test_custom_init_matches_sklearn_on_arrays(fmt, tol):
    rng = np.random.default_rng(0)
    X = rng.random((80, 7))
    if fmt == "sparse":
        X = sp.random(80, 7, density=0.4, random_state=1, format="csr")
    W0, H0 = _init(80, 7, 3)
    ours = FactorizedGNMF(3, init="custom", max_iter=120, tol=tol)
    W = ours.fit_transform(X, W=W0, H=H0)
    ref = _sk_nmf(3, init="custom", max_iter=120, tol=tol)
    W_ref = ref.fit_transform(X, W=W0.copy(), H=H0.copy())
    assert ours.n_iter_ == ref.n_iter_
    if tol > 0:
        assert ours.n_iter_ < 120  # the loss-based stop was exercised
    _assert_rel_close(W, W_ref, 1e-6, "W")
    _assert_rel_close(ours.components_, ref.components_, 1e-6, "H")
    np.testing.assert_allclose(
        ours.reconstruction_err_, ref.reconstruction_err_, rtol=1e-6
    )
    _assert_rel_close(ours.transform(X), ref.transform(X), 1e-6, "transform")


@pytest.mark.parametrize("scenario", ["star", "outer", "sparse", "many_to_many"])
@pytest.mark.parametrize("strategy", ["factorized", "materialized"])
def test_custom_init_matches_sklearn_on_datasets(scenario, strategy):
    ds = random_dataset(2, n_rows=150, scenario=scenario, nonneg=True)
    X = ds.materialize()
    W0, H0 = _init(*ds.shape, 3, seed=4)
    ours = FactorizedGNMF(3, init="custom", max_iter=60, strategy=strategy)
    W = ours.fit_transform(ds, W=W0, H=H0)
    ref = _sk_nmf(3, init="custom", max_iter=60)
    W_ref = ref.fit_transform(X, W=W0.copy(), H=H0.copy())
    assert ours.n_iter_ == ref.n_iter_ and ours.n_components_ == 3
    _assert_rel_close(W, W_ref, 1e-6, "W")
    _assert_rel_close(ours.components_, ref.components_, 1e-6, "H")
    np.testing.assert_allclose(
        ours.reconstruction_err_, ref.reconstruction_err_, rtol=1e-6
    )
    _assert_rel_close(ours.transform(ds), ref.transform(X), 1e-6, "transform")
    _assert_rel_close(
        ours.inverse_transform(W), ref.inverse_transform(W_ref), 1e-6, "inv"
    )


@pytest.mark.parametrize("scenario", ["left", "sparse"])
def test_blocked_updates_match_sklearn_across_many_blocks(monkeypatch, scenario):
    # The fused W update walks row blocks; force many small ones (and a partial
    # last block) so the block seams are exercised on small test data.
    import ilargi_sklearn.decomposition._gnmf as gnmf_module

    monkeypatch.setattr(gnmf_module, "_BLOCK_ELEMENTS", 1)
    ds = random_dataset(7, n_rows=333, scenario=scenario, nonneg=True)
    W0, H0 = _init(*ds.shape, 3, seed=5)
    ours = FactorizedGNMF(3, init="custom", max_iter=40, tol=1e-4)
    W = ours.fit_transform(ds, W=W0, H=H0)
    ref = _sk_nmf(3, init="custom", max_iter=40, tol=1e-4)
    W_ref = ref.fit_transform(ds.materialize(), W=W0.copy(), H=H0.copy())
    assert ours.n_iter_ == ref.n_iter_
    _assert_rel_close(W, W_ref, 1e-6, "W")
    _assert_rel_close(ours.components_, ref.components_, 1e-6, "H")
    np.testing.assert_allclose(
        ours.reconstruction_err_, ref.reconstruction_err_, rtol=1e-6
    )


@pytest.mark.parametrize("init", ["random", "nndsvda", "nndsvd", "nndsvdar", None])
def test_seeded_init_matches_sklearn(init):
    # The random draws and the randomized SVD (from products only) follow
    # scikit-learn's, so seeded initializations agree too.
    ds = random_dataset(6, n_rows=120, scenario="left", nonneg=True)
    X = ds.materialize()
    k = min(3, ds.shape[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        ours = FactorizedGNMF(k, init=init, random_state=0, max_iter=40).fit(ds)
        ref = _sk_nmf(k, init=init, random_state=0, max_iter=40).fit(X)
    # Both warn that MU cannot move the zeros of an "nndsvd" start.
    n_zero_warnings = sum("cannot update zeros" in str(w.message) for w in caught)
    assert n_zero_warnings == (2 if init == "nndsvd" else 0)
    _assert_rel_close(ours.components_, ref.components_, 1e-6, f"H ({init})")
    assert ours.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("transpose", [False, True])
def test_randomized_svd_from_products(transpose):
    rng = np.random.default_rng(0)
    X = rng.random((30, 12))
    X = X.T if transpose else X
    U, S, Vt = _randomized_svd(MatrixOperator(X), 4, random_state=0)
    S_exact = np.linalg.svd(X, compute_uv=False)[:4]
    np.testing.assert_allclose(S, S_exact, rtol=1e-8)
    np.testing.assert_allclose(U.T @ U, np.eye(4), atol=1e-10)
    np.testing.assert_allclose(U.T @ X @ Vt.T, np.diag(S), atol=1e-8)


def test_frobenius_error_without_forming_wh():
    rng = np.random.default_rng(1)
    X, W, H = rng.random((20, 6)), rng.random((20, 2)), rng.random((2, 6))
    err = _frobenius_error(float((X**2).sum()), W, H, X @ H.T)
    np.testing.assert_allclose(err, np.linalg.norm(X - W @ H), rtol=1e-12)


# -------------------------------------------------- factorized == materialized
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_factorized_equals_materialized(scenario):
    ds = random_dataset(8, n_rows=100, scenario=scenario, nonneg=True)
    rtol = _rtol(ds.dtype)
    k = min(2, ds.shape[1])
    W0, H0 = _init(*ds.shape, k, dtype=ds.dtype, seed=1)
    fits = {}
    for s in ("factorized", "materialized"):
        est = FactorizedGNMF(k, init="custom", max_iter=50, strategy=s)
        fits[s] = (est, est.fit_transform(ds, W=W0, H=H0))
    (f, Wf), (m, Wm) = fits["factorized"], fits["materialized"]
    assert Wf.dtype == ds.dtype and f.components_.dtype == ds.dtype
    assert f.n_iter_ == m.n_iter_
    _assert_rel_close(Wf, Wm, rtol, "W")
    _assert_rel_close(f.components_, m.components_, rtol, "H")
    np.testing.assert_allclose(f.reconstruction_err_, m.reconstruction_err_, rtol=rtol)
    _assert_rel_close(f.transform(ds), m.transform(ds), rtol, "transform")
    # Seeded default initialization (nndsvda from the randomized SVD).
    a = FactorizedGNMF(k, random_state=0, max_iter=20).fit(ds)
    b = FactorizedGNMF(k, random_state=0, max_iter=20, strategy="materialized").fit(ds)
    _assert_rel_close(a.components_, b.components_, 10 * rtol, "H (nndsvda)")


def test_factorized_fit_never_materializes(monkeypatch):
    ds = random_dataset(0, n_rows=200, scenario="snowflake", nonneg=True)

    def forbidden(self, format="auto"):
        raise AssertionError("the factorized fit built the joined matrix")

    monkeypatch.setattr(FactorizedMatrix, "materialize", forbidden)
    for init in ("nndsvda", "random"):
        est = FactorizedGNMF(2, init=init, random_state=0, max_iter=30)
        W = est.fit_transform(ds)
        assert W.shape == (200, 2) and (W >= 0).all()
        assert est.transform(ds).shape == (200, 2)


# --------------------------------------------------------------- array inputs
def test_dense_and_sparse_arrays_agree():
    X = sp.random(60, 8, density=0.5, random_state=0, format="csr")
    W0, H0 = _init(60, 8, 3)
    a = FactorizedGNMF(3, init="custom", max_iter=40)
    b = FactorizedGNMF(3, init="custom", max_iter=40)
    Wa = a.fit_transform(X, W=W0, H=H0)
    Wb = b.fit_transform(X.toarray(), W=W0, H=H0)
    _assert_rel_close(Wa, Wb, 1e-10, "W")
    _assert_rel_close(a.components_, b.components_, 1e-10, "H")


def test_float32_is_preserved():
    X = np.random.default_rng(0).random((40, 5)).astype(np.float32)
    est = FactorizedGNMF(2, random_state=0, max_iter=30)
    W = est.fit_transform(X)
    assert W.dtype == np.float32 and est.components_.dtype == np.float32
    assert est.transform(X).dtype == np.float32


def test_n_components_defaults():
    X = np.random.default_rng(0).random((30, 4))
    assert FactorizedGNMF(max_iter=5).fit(X).n_components_ == 4
    W0, H0 = _init(30, 4, 2)
    est = FactorizedGNMF("auto", init="custom", max_iter=5).fit(X, W=W0, H=H0)
    assert est.n_components_ == 2
    assert list(est.get_feature_names_out()) == ["factorizedgnmf0", "factorizedgnmf1"]


def test_reconstruction_error_is_the_frobenius_norm():
    ds = random_dataset(3, n_rows=80, scenario="union", nonneg=True)
    est = FactorizedGNMF(2, random_state=0, max_iter=100)
    W = est.fit_transform(ds)
    expected = np.linalg.norm(ds.materialize("dense") - W @ est.components_)
    np.testing.assert_allclose(est.reconstruction_err_, expected, rtol=1e-8)


# ------------------------------------------------------------------ bad input
def test_negative_values_raise():
    ds = random_dataset(0, n_rows=50, scenario="star")  # standard normal sources
    with pytest.raises(ValueError, match="Negative values in data passed to"):
        FactorizedGNMF(2).fit(ds)
    X = np.random.default_rng(0).random((20, 3))
    est = FactorizedGNMF(2, max_iter=10).fit(X)
    with pytest.raises(ValueError, match="Negative values in data passed to"):
        est.transform(X - 0.5)
    with pytest.raises(ValueError, match="Negative values in data passed to"):
        FactorizedGNMF(2).fit(sp.csr_matrix(X - 0.5))


def test_bad_custom_init():
    X = np.random.default_rng(0).random((20, 3))
    W0, H0 = _init(20, 3, 2)
    est = FactorizedGNMF(2, init="custom")
    with pytest.raises(TypeError, match="same dtype as X"):
        est.fit(X, W=W0.astype(np.float32), H=H0)
    with pytest.raises(ValueError, match="wrong first dimension"):
        est.fit(X, W=W0[:5], H=H0)
    with pytest.raises(ValueError, match="full of zeros"):
        est.fit(X, W=np.zeros_like(W0), H=H0)
    with pytest.raises(ValueError, match="Negative values"):
        est.fit(X, W=-W0, H=H0)
    with pytest.warns(RuntimeWarning, match="provided W or H are ignored"):
        FactorizedGNMF(2, init="random", max_iter=5).fit(X, W=W0, H=H0)
    with pytest.raises(ValueError, match="n_components <= min"):
        FactorizedGNMF(5, init="nndsvda").fit(X)


def test_not_fitted():
    X = np.random.default_rng(0).random((10, 3))
    with pytest.raises(NotFittedError):
        FactorizedGNMF(2).transform(X)
    with pytest.raises(NotFittedError):
        FactorizedGNMF(2).inverse_transform(np.ones((2, 2)))


def test_wrong_feature_count():
    ds = random_dataset(0, n_rows=40, scenario="star", nonneg=True)
    est = FactorizedGNMF(1, max_iter=10).fit(ds)
    other = random_dataset(0, n_rows=40, scenario="star", n_sources=4, nonneg=True)
    with pytest.raises(ValueError, match=f"is expecting {ds.shape[1]} features"):
        est.transform(other)
    est = FactorizedGNMF(1, max_iter=10).fit(np.ones((5, 3)))
    with pytest.raises(ValueError, match="is expecting 3 features"):
        est.transform(np.ones((5, 2)))


def test_inputs_unchanged():
    ds = random_dataset(4, n_rows=60, scenario="left", nonneg=True)
    before = ds.materialize("dense").copy()
    W0, H0 = _init(*ds.shape, 2)
    W0c, H0c = W0.copy(), H0.copy()
    est = FactorizedGNMF(2, init="custom", max_iter=20)
    est.fit_transform(ds, W=W0, H=H0)
    components = est.components_.copy()
    est.transform(ds)
    np.testing.assert_array_equal(W0, W0c)
    np.testing.assert_array_equal(H0, H0c)
    np.testing.assert_array_equal(est.components_, components)
    np.testing.assert_array_equal(ds.materialize("dense"), before)


def test_sklearn_check_estimator():
    # Converged fits: at scikit-learn's check defaults (max_iter=500, tol=1e-4) the
    # slow MU solver leaves fit_transform's W and transform's W more than 1e-2 apart
    # (check_transformer_general); scikit-learn's NMF(solver="mu") fails the same.
    results = check_estimator(
        FactorizedGNMF(n_components=2, max_iter=2000, tol=1e-10, random_state=0),
        on_fail=None,
    )
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert failed == []
