"""GNMF's compiled W update (``decomposition/_gnmf_numba.py``): equal to NumPy, with fallback."""

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import plant_compile_failure, tolerance

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.decomposition import _gnmf_numba
from ilargi_sklearn.multisource._operators import fused_layout
from ilargi_sklearn.utils._testing import random_dataset

numba = pytest.importorskip("numba")

# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


# ------------------------------------------------------------- segment row sums
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_segment_sum_rows_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    n, k, bins = 40_000, 7, 300
    idx = rng.integers(-1, bins, n)
    W = rng.random((n, k)).astype(dtype)
    expected = np.zeros((bins, k))
    keep = idx >= 0
    np.add.at(expected, idx[keep], W[keep].astype(np.float64))
    got = _gnmf_numba.segment_sum_rows(idx, W, bins)
    assert got.shape == (bins, k) and got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mu_update_equals_numpy_bitwise(dtype):
    # The compiled update does NumPy's operations in NumPy's order: bitwise the
    # same W, zero denominators replaced by eps, the numerator untouched.
    rng = np.random.default_rng(3)
    W = rng.random((321, 5)).astype(dtype)
    num = rng.random((321, 5)).astype(dtype)
    den = rng.random((321, 5)).astype(dtype)
    den[::7, 1] = 0
    eps = dtype(np.finfo(np.float32).eps)
    expected = W * (num / np.where(den == 0, eps, den))
    got, num_before, den_before = W.copy(), num.copy(), den.copy()
    assert _gnmf_numba.mu_update(num, den, got, eps)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(num, num_before)
    np.testing.assert_array_equal(den, den_before)
    # Not C-contiguous, or another dtype: left to NumPy, W untouched.
    for args in (
        (num, den, np.asfortranarray(W)),
        (num[:, :4], den[:, :4], W[:, :4].copy()),
        (num.astype(np.float16), den, W),
    ):
        before = args[2].copy()
        assert not _gnmf_numba.mu_update(*args, eps)
        np.testing.assert_array_equal(args[2], before)


def test_gnmf_update_compile_failure_falls_back_to_numpy(monkeypatch, caplog):
    # The update kernel fails to compile at its first block: that block and the
    # rest run NumPy's operations, and the fit is the NumPy path's.
    from ilargi_sklearn.decomposition import FactorizedGNMF

    monkeypatch.delenv(_launcher.NO_NUMBA_ENV, raising=False)
    ds = random_dataset(2, scenario="left", n_rows=400, nonneg=True)
    kw = dict(n_components=3, init="nndsvda", max_iter=15, tol=0.0)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedGNMF(**kw).fit(ds)

    plant_compile_failure(monkeypatch, "mu_update")
    with caplog.at_level("WARNING", logger=_launcher.__name__):
        est = FactorizedGNMF(**kw).fit(ds)
    assert "could not compile the 'mu_update' kernel" in caplog.text
    assert not _launcher.numba_available()
    np.testing.assert_allclose(est.components_, ref.components_, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gnmf_compiled_pass_equals_numpy(monkeypatch, dtype):
    # The W update: compiled where numba runs, NumPy's block operations (and the
    # CSC indicator product for I^T W) otherwise; the same factors.
    from ilargi_sklearn.decomposition import FactorizedGNMF

    ds = random_dataset(1, scenario="left", n_rows=500, nonneg=True, dtype=dtype)
    kw = dict(n_components=3, init="nndsvda", max_iter=30, tol=0.0)
    calls = []
    original = _gnmf_numba.mu_update

    def spy(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(
        "ilargi_sklearn.decomposition._gnmf_fused.mu_update", spy, raising=True
    )
    fast = FactorizedGNMF(**kw).fit(ds)
    assert calls
    W_fast = fast.transform(ds)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        n_calls = len(calls)
        plain = FactorizedGNMF(**kw).fit(ds)
        W_plain = plain.transform(ds)
        assert len(calls) == n_calls
    assert fast.components_.dtype == dtype
    # The same update; the segment sums are summed in another order.
    # (Entries that MU drives towards zero are compared on the factor's scale.)
    rtol = tolerance(dtype, "operator")
    for got, ref in ((fast.components_, plain.components_), (W_fast, W_plain)):
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
    np.testing.assert_allclose(
        fast.reconstruction_err_, plain.reconstruction_err_, rtol=rtol
    )


def _mu_rows_case(k, d0=3, n=203, const=True, seed=0):
    rng = np.random.default_rng(seed)
    X0 = rng.random((n, d0))
    HbT = rng.random((d0, k))
    sizes = (30, 7)  # source rows; each table has one more (zero) padding row
    G = np.zeros((sum(sizes) + 2, k))
    offsets = np.array([0, sizes[0] + 1])
    pads = np.array(sizes)
    G[: sizes[0]] = rng.random((sizes[0], k))
    G[offsets[1] : offsets[1] + sizes[1]] = rng.random((sizes[1], k))
    idxs = [rng.integers(-1, r, n) for r in sizes]
    HHt = rng.random((k, k))
    HHt[:, 1] = 0  # zero denominators: eps
    W = rng.random((n, k))
    c = rng.random(k) if const else None
    return X0, HbT, idxs, G, offsets, pads, c, HHt, W


@pytest.mark.parametrize("k", [8, 9, 10, 13, 16])
@pytest.mark.parametrize("const", [True, False])
@pytest.mark.parametrize("d0", [0, 3])
@pytest.mark.parametrize("gathered", [False, True])
def test_mu_rows_equals_numpy(k, const, d0, gathered):
    # The compiled row update: numerator and denominator per row in registers
    # (two overlapping 8-lane blocks per row, four rows per step), rows outside
    # [start, stop) untouched; partial steps of 1 to 3 rows at either end. With
    # ``gathered`` the second group comes as rows gathered beforehand (P).
    X0, HbT, idxs, G, offsets, pads, c, HHt, W = _mu_rows_case(k, d0, const=const)
    eps = 1e-10
    num = X0 @ HbT + (0 if c is None else c)
    for idx, o, pad in zip(idxs, offsets, pads, strict=True):
        num += G[o + np.where(idx >= 0, idx, pad)]
    den = W @ HHt
    expected = W * (num / np.where(den == 0, eps, den))
    n_in = 1 if gathered else 2
    for start, stop in ((0, 203), (5, 199), (7, 8), (0, 2), (100, 103)):
        P = None
        if gathered:
            rows = idxs[1][start:stop]
            P = G[offsets[1] + np.where(rows >= 0, rows, pads[1])]
        got = W.copy()
        WW = np.full((k, 16), 2.0)  # the gram is added to what it holds
        args = (X0, HbT, idxs[:n_in], G, offsets[:n_in], pads[:n_in], c, P, HHt)
        assert _gnmf_numba.mu_rows(*args, got, eps, WW, start, stop)
        np.testing.assert_allclose(got[start:stop], expected[start:stop], rtol=1e-13)
        np.testing.assert_array_equal(got[:start], W[:start])
        np.testing.assert_array_equal(got[stop:], W[stop:])
        new = expected[start:stop]
        np.testing.assert_allclose(
            _gnmf_numba.mu_rows_gram(WW, k) - 2.0, new.T @ new, rtol=1e-12, atol=1e-12
        )
        # Without the gram (as transform asks): the same update.
        alone = W.copy()
        assert _gnmf_numba.mu_rows(*args, alone, eps, None, start, stop)
        np.testing.assert_array_equal(alone, got)


def test_mu_rows_declines_what_it_does_not_take():
    X0, HbT, idxs, G, offsets, pads, c, HHt, W = _mu_rows_case(10)
    args = [X0, HbT, idxs, G, offsets, pads, c, None, HHt, W]
    cases = {
        "7 columns": {
            1: HbT[:, :7].copy(),
            3: G[:, :7].copy(),
            6: c[:7],
            8: HHt[:7, :7].copy(),
            9: W[:, :7].copy(),
        },
        "17 columns": {
            1: np.ones((3, 17)),
            3: np.ones((G.shape[0], 17)),
            6: np.ones(17),
            8: np.ones((17, 17)),
            9: np.ones((203, 17)),
        },
        "float32 W": {9: W.astype(np.float32)},
        "Fortran W": {9: np.asfortranarray(W)},
        "wrong HbT": {1: HbT[:2]},
        "wrong const": {6: c[:9]},
        "wrong P": {7: np.ones((5, 10))},
        "wrong WW": {"WW": np.zeros((10, 8))},
    }
    for what, changes in cases.items():
        a = list(args)
        for i, v in changes.items():
            if isinstance(i, int):
                a[i] = v
        WW = changes.get("WW", np.zeros((a[9].shape[1], 16)))
        before = a[9].copy()
        assert not _gnmf_numba.mu_rows(*a, 1e-10, WW, 0, a[9].shape[0]), what
        np.testing.assert_array_equal(a[9], before)


@pytest.fixture
def spy_mu_rows(monkeypatch):
    """The results of the GNMF fits' mu_rows calls (True: the loop ran)."""
    calls = []
    original = _gnmf_numba.mu_rows

    def spy(*args):
        calls.append(original(*args))
        return calls[-1]

    monkeypatch.setattr("ilargi_sklearn.decomposition._gnmf_fused.mu_rows", spy)
    return calls


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("scenario", ["left", "sparse", "overlap"])
def test_gnmf_row_update_equals_numpy(monkeypatch, spy_mu_rows, scenario, gather):
    # 10 components: the W pass runs mu_rows where it applies (a dense base or
    # none, not a CSR one) and matches the NumPy pass; with ``gather`` every
    # table counts as large and is gathered by np.take before the loop.
    from ilargi_sklearn.decomposition import FactorizedGNMF, _gnmf_fused

    if gather:
        monkeypatch.setattr(_gnmf_fused, "_INLINE_TABLE_BYTES", 0)

    ds = random_dataset(3, scenario=scenario, n_rows=700, nonneg=True)
    rng = np.random.default_rng(1)
    W0, H0 = rng.random((ds.shape[0], 10)), rng.random((10, ds.shape[1]))
    kw = dict(n_components=10, init="custom", max_iter=25, tol=0.0)
    fast = FactorizedGNMF(**kw)
    W_fast = fast.fit_transform(ds, W=W0.copy(), H=H0.copy())
    base = fused_layout(ds.operator).base
    # A CSR base: the plan does not call the loop at all.
    applies = base is None or not sp.issparse(base)
    assert bool(spy_mu_rows) == applies and all(spy_mu_rows)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        n_calls = len(spy_mu_rows)
        plain = FactorizedGNMF(**kw)
        W_plain = plain.fit_transform(ds, W=W0.copy(), H=H0.copy())
        assert len(spy_mu_rows) == n_calls
    for got, ref in ((fast.components_, plain.components_), (W_fast, W_plain)):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_gnmf_row_update_compile_failure_falls_back(monkeypatch, caplog):
    # mu_rows fails to compile at the first block: that block and the rest run
    # the NumPy block operations, and the fit is the NumPy path's.
    from ilargi_sklearn.decomposition import FactorizedGNMF

    ds = random_dataset(2, scenario="left", n_rows=400, nonneg=True)
    rng = np.random.default_rng(2)
    W0, H0 = rng.random((ds.shape[0], 9)), rng.random((9, ds.shape[1]))
    kw = dict(n_components=9, init="custom", max_iter=15, tol=0.0)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedGNMF(**kw).fit(ds, W=W0.copy(), H=H0.copy())
    plant_compile_failure(monkeypatch, "mu_rows")
    with caplog.at_level("WARNING", logger=_launcher.__name__):
        est = FactorizedGNMF(**kw).fit(ds, W=W0.copy(), H=H0.copy())
    assert "could not compile the 'mu_rows' kernel" in caplog.text
    assert not _launcher.numba_available()
    np.testing.assert_allclose(est.components_, ref.components_, rtol=1e-10)
