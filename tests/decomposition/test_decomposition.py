"""FactorizedGNMF: parity with scikit-learn's NMF (mu, Frobenius), factorized ==
materialized, bad input."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import dense, tolerance
from sklearn.decomposition import NMF
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from ilargi_sklearn.decomposition import FactorizedGNMF, _gnmf_fused
from ilargi_sklearn.decomposition._gnmf import _frobenius_error
from ilargi_sklearn.decomposition._svd import _randomized_svd
from ilargi_sklearn.multisource import FactorizedMatrix, MatrixOperator
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


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


# k = 10: the compiled row update (mu_rows, 8 to 16 components) where numba runs.
@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("scenario", ["star", "outer", "sparse", "many_to_many"])
@pytest.mark.parametrize("strategy", ["factorized", "materialized"])
def test_custom_init_matches_sklearn_on_datasets(scenario, strategy, k):
    ds = random_dataset(2, n_rows=150, scenario=scenario, nonneg=True)
    X = ds.materialize()
    W0, H0 = _init(*ds.shape, k, seed=4)
    ours = FactorizedGNMF(k, init="custom", max_iter=60, strategy=strategy)
    W = ours.fit_transform(ds, W=W0, H=H0)
    ref = _sk_nmf(k, init="custom", max_iter=60)
    W_ref = ref.fit_transform(X, W=W0.copy(), H=H0.copy())
    assert ours.n_iter_ == ref.n_iter_ and ours.n_components_ == k
    _assert_rel_close(W, W_ref, 1e-6, "W")
    _assert_rel_close(ours.components_, ref.components_, 1e-6, "H")
    np.testing.assert_allclose(
        ours.reconstruction_err_, ref.reconstruction_err_, rtol=1e-6
    )
    _assert_rel_close(ours.transform(ds), ref.transform(X), 1e-6, "transform")
    _assert_rel_close(
        ours.inverse_transform(W), ref.inverse_transform(W_ref), 1e-6, "inv"
    )


@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("scenario", ["left", "sparse"])
def test_blocked_updates_match_sklearn_across_many_blocks(monkeypatch, scenario, k):
    # The fused W update walks row blocks; force many small ones (and a partial
    # last block) so the block seams are exercised on small test data.

    monkeypatch.setattr(_gnmf_fused, "_BLOCK_ELEMENTS", 1)
    ds = random_dataset(7, n_rows=333, scenario=scenario, nonneg=True)
    W0, H0 = _init(*ds.shape, k, seed=5)
    ours = FactorizedGNMF(k, init="custom", max_iter=40, tol=1e-4)
    W = ours.fit_transform(ds, W=W0, H=H0)
    ref = _sk_nmf(k, init="custom", max_iter=40, tol=1e-4)
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
@pytest.mark.parametrize("k", [2, 10])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_factorized_equals_materialized(scenario, k):
    ds = random_dataset(8, n_rows=100, scenario=scenario, nonneg=True)
    rtol = tolerance(ds.dtype, "iterative")
    k = min(k, ds.shape[1]) if k == 2 else k
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
    assert FactorizedGNMF(None, max_iter=5).fit(X).n_components_ == 4
    W0, H0 = _init(30, 4, 2)
    # The default "auto" takes the rank of a custom H, as scikit-learn's NMF does.
    assert FactorizedGNMF().get_params()["n_components"] == NMF().n_components
    est = FactorizedGNMF(init="custom", max_iter=5).fit(X, W=W0, H=H0)
    assert est.n_components_ == 2
    with pytest.raises(ValueError, match="Expected 4"):
        FactorizedGNMF(None, init="custom", max_iter=5).fit(X, W=W0, H=H0)
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


# ------------------------------------------- blocked T H^T (no n x k product array)
def _array_path(monkeypatch):
    """Force the n x k ``T H^T`` path (as for operators without a fused layout)."""
    import ilargi_sklearn.decomposition._gnmf as gnmf_module

    monkeypatch.setattr(gnmf_module, "fused_layout", lambda op: None)


def _fit_op(op, W0, H0, **kw):
    from ilargi_sklearn.decomposition._gnmf import _fit_multiplicative_update

    return _fit_multiplicative_update(op, W0.copy(), H0.copy(), **kw)


@pytest.mark.parametrize(
    "scenario",
    ["star", "left", "outer", "overlap", "sparse", "float32", "snowflake", "union"],
)
# tol=1e-9: checks at 10, 20 and 30 iterations, none at the last (35).
@pytest.mark.parametrize("tol", [0.0, 2e-2, 1e-9])
def test_blocked_numerator_matches_array_path_and_sklearn(monkeypatch, scenario, tol):
    # 64-row blocks (the minimum) over 333 rows: several blocks and a partial last
    # one; left/outer/snowflake/overlap have unmatched rows (index -1), "overlap"
    # has a target column covered by two sources, "sparse" CSR sources.
    from ilargi_sklearn.multisource._operators import fused_layout

    monkeypatch.setattr(_gnmf_fused, "_BLOCK_ELEMENTS", 1)
    ds = random_dataset(11, n_rows=333, scenario=scenario, nonneg=True)
    op = ds.operator
    rtol = tolerance(ds.dtype, "iterative")
    k = min(3, ds.shape[1])
    W0, H0 = _init(*ds.shape, k, dtype=ds.dtype, seed=2)
    kw = dict(max_iter=35, tol=tol, return_error=True)
    assert fused_layout(op) is not None  # the blocked path runs
    Wb, Hb, it_b, err_b = _fit_op(op, W0, H0, **kw)
    Wt, Ht, it_t, err_t = _fit_op(op, W0, H0, update_H=False, **kw)
    with monkeypatch.context() as m:
        _array_path(m)
        Wa, Ha, it_a, err_a = _fit_op(op, W0, H0, **kw)
    assert Wb.dtype == ds.dtype and Hb.dtype == ds.dtype
    assert it_b == it_a
    _assert_rel_close(Wb, Wa, rtol, "W vs array path")
    _assert_rel_close(Hb, Ha, rtol, "H vs array path")
    np.testing.assert_allclose(err_b, err_a, rtol=rtol)
    # scikit-learn on the joined matrix, same start and iterations.
    X = ds.materialize()
    ref = _sk_nmf(k, init="custom", max_iter=35, tol=tol)
    W_ref = ref.fit_transform(X, W=W0.copy(), H=H0.copy())
    assert it_b == ref.n_iter_
    if tol >= 2e-2:
        assert it_b < 35  # the blockwise loss check stopped the fit
    _assert_rel_close(Wb, W_ref, rtol, "W vs sklearn")
    _assert_rel_close(Hb, ref.components_, rtol, "H vs sklearn")
    np.testing.assert_allclose(err_b, ref.reconstruction_err_, rtol=rtol)
    # W with H fixed (transform): the tables are built once.
    _, _, _, err_ref = _fit_op(MatrixOperator(X), W0, H0, update_H=False, **kw)
    np.testing.assert_allclose(err_t, err_ref, rtol=rtol)
    assert (Ht == H0).all()
    Xd = dense(X)
    direct = np.linalg.norm(Xd.astype(np.float64) - Wt.astype(np.float64) @ H0)
    np.testing.assert_allclose(err_t, direct, rtol=10 * rtol)


def test_blocked_fit_builds_no_n_by_k_product(monkeypatch):
    # The blocked path never calls matmul/rmatmul on the factorized operator: T H^T
    # exists one row block at a time, T^T W from in-pass sums and segment sums.
    ds = random_dataset(3, n_rows=300, scenario="left", nonneg=True)
    W0, H0 = _init(*ds.shape, 2, seed=3)
    ref = _fit_op(ds.operator, W0, H0, max_iter=25, tol=1e-4, return_error=True)
    with monkeypatch.context() as m:
        _array_path(m)
        arr = _fit_op(ds.operator, W0, H0, max_iter=25, tol=1e-4, return_error=True)

    def forbidden(self, X, out=None):
        raise AssertionError("an n-length product was computed")

    monkeypatch.setattr(FactorizedMatrix, "matmul", forbidden)
    monkeypatch.setattr(FactorizedMatrix, "rmatmul", forbidden)
    W, H, n_iter, err = _fit_op(
        ds.operator, W0, H0, max_iter=25, tol=1e-4, return_error=True
    )
    assert n_iter == ref[2] == arr[2]
    _assert_rel_close(W, arr[0], 1e-10, "W")
    _assert_rel_close(H, arr[1], 1e-10, "H")
    np.testing.assert_allclose(err, arr[3], rtol=1e-10)


@pytest.mark.parametrize("k", [2, 10])
@pytest.mark.parametrize("scenario", ["left", "overlap", "sparse", "float32"])
def test_blocked_numerator_under_scaling_layer(monkeypatch, scenario, k):
    # A FactorizedStandardScaler(with_mean=False) output (T' = T diag(s)) and an
    # affine layer with offsets (a min-max-like shift, T' = (T - 1 o^T) diag(s),
    # non-negative; no offset on CSR columns, which stay unshifted).
    from ilargi_sklearn.multisource import AffineOperator
    from ilargi_sklearn.multisource._operators import fused_layout
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler

    monkeypatch.setattr(_gnmf_fused, "_BLOCK_ELEMENTS", 1)
    ds = random_dataset(5, n_rows=260, scenario=scenario, nonneg=True)
    rtol = tolerance(ds.dtype, "iterative")
    scaled = FactorizedStandardScaler(with_mean=False).fit(ds).transform(ds)
    X = ds.materialize("dense").astype(np.float64)
    sparse_cols = fused_layout(ds.operator).sparse_cols()
    offset = X.min(axis=0) * 0.5
    offset[sparse_cols] = 0.0
    scale = 1.0 / (X.max(axis=0) - offset + 1.0)
    shifted = AffineOperator(ds.operator, scale, offset)
    W0, H0 = _init(*ds.shape, k, dtype=ds.dtype, seed=6)
    for op in (scaled.operator, shifted):
        assert fused_layout(op) is not None
        Xs = op.materialize("dense")
        assert Xs.min() >= 0
        W, H, n_iter, err = _fit_op(
            op, W0, H0, max_iter=30, tol=1e-4, return_error=True
        )
        with monkeypatch.context() as m:
            _array_path(m)
            Wa, Ha, n_a, err_a = _fit_op(
                op, W0, H0, max_iter=30, tol=1e-4, return_error=True
            )
        ref = _sk_nmf(k, init="custom", max_iter=30, tol=1e-4)
        W_ref = ref.fit_transform(Xs, W=W0.copy(), H=H0.copy())
        assert n_iter == n_a == ref.n_iter_
        for A, B, what in ((W, Wa, "W/array"), (H, Ha, "H/array"), (W, W_ref, "W/sk")):
            _assert_rel_close(A, B, rtol, what)
        _assert_rel_close(H, ref.components_, rtol, "H/sk")
        np.testing.assert_allclose(err, ref.reconstruction_err_, rtol=rtol)
    # Through the estimator on the scaled dataset.
    est = FactorizedGNMF(k, init="custom", max_iter=30, tol=0)
    W = est.fit_transform(scaled, W=W0, H=H0)
    ref = _sk_nmf(k, init="custom", max_iter=30, tol=0)
    W_ref = ref.fit_transform(scaled.materialize("dense"), W=W0.copy(), H=H0.copy())
    _assert_rel_close(W, W_ref, rtol, "W (estimator)")
    _assert_rel_close(
        est.transform(scaled),
        ref.transform(scaled.materialize("dense")),
        rtol,
        "transform",
    )


# ------------------------------------------------- one kernel, three W updates
def test_w_update_picks_the_numpy_fast_variants():
    # The blocked numerator on a NumPy factorized operator (its layout's dtype),
    # the in-place row-block pass on other NumPy operators, the generic update on
    # every other namespace.
    from ilargi_sklearn.decomposition import _gnmf

    xps = pytest.importorskip("array_api_strict")
    ds = random_dataset(3, n_rows=120, scenario="left", nonneg=True)
    W = np.ones((ds.shape[0], 2))
    assert type(_gnmf._w_update(ds.operator, W)) is _gnmf_fused._BlockedNumerator
    assert type(_gnmf._w_update(ds.operator, W.astype(np.float32))) is (
        _gnmf._HostProductNumerator
    )
    assert type(_gnmf._w_update(MatrixOperator(ds.materialize()), W)) is (
        _gnmf._HostProductNumerator
    )
    dev = ds.to_device(xps.Device("device1"), namespace=xps).operator
    Wd = xps.asarray(W, device=xps.Device("device1"))
    assert type(_gnmf._w_update(dev, Wd)) is _gnmf._ProductNumerator


@pytest.mark.parametrize("scenario", ["left", "overlap", "sparse", "float32"])
@pytest.mark.parametrize("update_H", [True, False])
def test_generic_w_update_on_numpy_matches_the_fast_variants(
    monkeypatch, scenario, update_H
):
    # The namespace-generic W update, forced on NumPy data, gives the factors,
    # iteration count and loss of the NumPy variants (the same kernel around it).
    import ilargi_sklearn.decomposition._gnmf as gnmf_module

    monkeypatch.setattr(_gnmf_fused, "_BLOCK_ELEMENTS", 1)
    ds = random_dataset(8, n_rows=250, scenario=scenario, nonneg=True)
    rtol = tolerance(ds.dtype, "iterative")
    W0, H0 = _init(*ds.shape, 3, dtype=ds.dtype, seed=4)
    kw = dict(max_iter=30, tol=1e-4, update_H=update_H, return_error=True)
    fast = _fit_op(ds.operator, W0, H0, **kw)
    with monkeypatch.context() as m:
        m.setattr(gnmf_module, "_w_update", gnmf_module._ProductNumerator)
        generic = _fit_op(ds.operator, W0, H0, **kw)
    assert generic[0].dtype == ds.dtype and generic[2] == fast[2]
    _assert_rel_close(generic[0], fast[0], rtol, "W")
    _assert_rel_close(generic[1], fast[1], rtol, "H")
    np.testing.assert_allclose(generic[3], fast[3], rtol=rtol)
