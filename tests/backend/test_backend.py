"""Row maps, segment sums and the factorized operators against dense references."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, dense

from ilargi_sklearn._backend import RowMap, safe_sparse_dot, segment_sum
from ilargi_sklearn.multisource import _operators
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


def _dense_indicator(idx, n_source_rows):
    ind = np.zeros((idx.shape[0], n_source_rows))
    rows = np.flatnonzero(idx >= 0)
    ind[rows, idx[rows]] = 1.0
    return ind


@pytest.fixture(params=["full", "missing"])
def rowmap_case(request):
    rng = np.random.default_rng(3)
    n, r = 50, 7
    idx = rng.integers(0, r, n)
    if request.param == "missing":
        idx[rng.random(n) < 0.3] = -1
        idx[0] = -1
    return RowMap(idx, r), _dense_indicator(idx, r), rng


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [None, 1, 4])
def test_gather_scatter_match_dense_indicator(rowmap_case, dtype, k):
    rm, ind, rng = rowmap_case
    shape_z = (rm.n_source_rows,) if k is None else (rm.n_source_rows, k)
    shape_y = (rm.n_rows,) if k is None else (rm.n_rows, k)
    Z = rng.standard_normal(shape_z).astype(dtype)
    Y = rng.standard_normal(shape_y).astype(dtype)

    G = rm.gather(Z)
    S = rm.scatter(Y)
    assert G.dtype == dtype and G.shape == shape_y
    assert S.dtype == dtype and S.shape == shape_z
    assert_close(G, ind @ Z, dtype=dtype, kind="operator")
    assert_close(S, ind.T @ Y, dtype=dtype, kind="operator")
    # Blocks of target rows (as FactorizedMatrix.matmul uses them) agree too.
    block = rm.gather(Z, slice(5, 31))
    assert block.dtype == dtype
    assert_close(block, (ind @ Z)[5:31], dtype=dtype, kind="operator")
    if rm.has_missing:
        unmatched = ~rm.matched
        assert unmatched.any()
        assert np.all(G[unmatched] == 0)


def test_gather_scatter_sparse_operands(rowmap_case):
    rm, ind, rng = rowmap_case
    Z = sp.random(rm.n_source_rows, 3, density=0.5, random_state=1, format="csr")
    Y = sp.random(rm.n_rows, 3, density=0.5, random_state=2, format="csr")
    G, S = rm.gather(Z), rm.scatter(Y)
    assert sp.issparse(G) and sp.issparse(S)
    np.testing.assert_allclose(G.toarray(), ind @ Z.toarray(), rtol=1e-12)
    np.testing.assert_allclose(S.toarray(), ind.T @ Y.toarray(), rtol=1e-12)


def test_identity_rowmap_passes_arrays_through():
    rm = RowMap(None, 5)
    Z = np.arange(10.0).reshape(5, 2)
    assert rm.is_identity and not rm.has_missing
    assert rm.gather(Z) is Z and rm.scatter(Z) is Z
    np.testing.assert_array_equal(rm.idx, np.arange(5))
    np.testing.assert_allclose(rm.counts(), np.ones(5))
    np.testing.assert_allclose(rm.indicator().toarray(), np.eye(5))


def test_counts_and_indicator(rowmap_case):
    rm, ind, rng = rowmap_case
    w = rng.random(rm.n_rows)
    np.testing.assert_allclose(rm.counts(), ind.sum(axis=0))
    np.testing.assert_allclose(rm.counts(w), ind.T @ w, rtol=1e-12)
    for dtype in (np.float64, np.float32):
        ind_sp = rm.indicator(dtype)
        assert sp.issparse(ind_sp) and ind_sp.dtype == dtype
        assert ind_sp.nnz == int(rm.matched.sum())
        np.testing.assert_array_equal(ind_sp.toarray(), ind)


def test_take_and_masked(rowmap_case):
    rm, ind, rng = rowmap_case
    rows = rng.permutation(rm.n_rows)[:20]
    np.testing.assert_array_equal(rm.take(rows).idx, rm.idx[rows])
    drop = rng.random(rm.n_rows) < 0.5
    m = rm.masked(drop)
    assert np.all(m.idx[drop] == -1)
    np.testing.assert_array_equal(m.idx[~drop], rm.idx[~drop])
    assert m.has_missing == bool(drop.any() or rm.has_missing)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kind", ["index-index", "identity-index", "index-identity"])
def test_cooccurrence_matches_dense(weighted, kind):
    rng = np.random.default_rng(7)
    n = 40
    idx_a = rng.integers(0, 6, n)
    idx_b = rng.integers(0, 4, n)
    idx_a[rng.random(n) < 0.2] = -1
    idx_b[rng.random(n) < 0.2] = -1
    a = RowMap(None, n) if kind == "identity-index" else RowMap(idx_a, 6)
    b = RowMap(None, n) if kind == "index-identity" else RowMap(idx_b, 4)
    Ia = _dense_indicator(a.idx, a.n_source_rows)
    Ib = _dense_indicator(b.idx, b.n_source_rows)
    w = rng.random(n) if weighted else None
    C = a.cooccurrence(b, w)
    assert sp.issparse(C) and C.shape == (a.n_source_rows, b.n_source_rows)
    expected = Ia.T @ (Ib if w is None else w[:, None] * Ib)
    np.testing.assert_allclose(C.toarray(), expected, rtol=1e-12)
    C32 = a.cooccurrence(b, w, dtype=np.float32)
    assert C32.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_segment_sum(dtype, ndim, weighted):
    rng = np.random.default_rng(11)
    n, r = 30, 5
    idx = rng.integers(-1, r, n)
    Y = rng.standard_normal((n,) if ndim == 1 else (n, 3)).astype(dtype)
    w = rng.random(n).astype(dtype) if weighted else None
    out = segment_sum(Y, idx, r, w)
    ind = _dense_indicator(idx, r)
    Yw = Y if w is None else (Y * (w if ndim == 1 else w[:, None]))
    assert out.dtype == dtype and out.shape == (r,) + Y.shape[1:]
    assert_close(out, ind.T @ Yw, dtype=dtype, kind="operator")
    # Buckets nobody maps to stay zero; -1 rows are dropped, not summed anywhere.
    assert_close(
        out.sum(axis=0), Yw[idx >= 0].sum(axis=0), dtype=dtype, kind="operator"
    )


def test_rowmap_pickling_drops_caches(rowmap_case):
    rm, ind, rng = rowmap_case
    rm.indicator(np.float64)
    rm.scatter(rng.standard_normal((rm.n_rows, 2)))
    assert rm._indicators
    clone = pickle.loads(pickle.dumps(rm))
    assert clone._indicators == {}
    assert clone.n_rows == rm.n_rows and clone.n_source_rows == rm.n_source_rows
    np.testing.assert_array_equal(clone.idx, rm.idx)
    Z = rng.standard_normal(rm.n_source_rows)
    np.testing.assert_allclose(clone.gather(Z), rm.gather(Z), rtol=1e-15)


def test_rowmap_rejects_bad_index_vectors():
    with pytest.raises(TypeError, match="must be integers, got dtype float64"):
        RowMap(np.array([0.0, 1.0]), 2)
    # Below -1 would silently wrap around in np.take: refused on first use.
    with pytest.raises(ValueError, match="got the value -2"):
        RowMap(np.array([0, -2]), 2).gather(np.ones(2))
    with pytest.raises(ValueError, match="got the value -3"):
        segment_sum(np.ones(2), np.array([-3, 0]), 2)


def test_safe_sparse_dot_returns_dense_for_mixed():
    A = sp.random(4, 3, density=0.5, random_state=0, format="csr")
    B = np.ones((3, 2))
    out = safe_sparse_dot(A, B)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, A.toarray() @ B)
    assert sp.issparse(safe_sparse_dot(A, A.T))


# -- factorized == materialized over every integration scenario ------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sq_block", [None, 7], ids=["one-block", "squares-of-7"])
def test_factorized_equals_materialized(scenario, seed, sq_block, monkeypatch):
    if sq_block is not None:
        # Sources squared in row blocks, as on large data (a shorter last one).
        monkeypatch.setattr(_operators, "_SQ_BLOCK", sq_block)
    ds = random_dataset(seed, n_rows=50, scenario=scenario)
    op = ds.operator
    mat = op.materialized()
    T = np.asarray(ds.materialize("dense"), dtype=np.float64)
    dtype = op.dtype
    rng = np.random.default_rng(seed)
    n, m = op.shape
    x, X = (
        rng.standard_normal(m).astype(dtype),
        rng.standard_normal((m, 3)).astype(dtype),
    )
    y, Y = (
        rng.standard_normal(n).astype(dtype),
        rng.standard_normal((n, 3)).astype(dtype),
    )
    w = rng.random(n).astype(dtype)
    cw = rng.random(m).astype(dtype)
    rows = rng.permutation(n)[: n // 2]

    def check(f, *args, ref):
        got, other = f(op)(*args), f(mat)(*args)
        got, other = dense(got), dense(other)
        assert got.dtype == dtype, f"{f}: dtype {got.dtype} != {dtype}"
        assert_close(got, other, dtype=dtype, kind="operator")
        assert_close(got, ref, dtype=dtype, kind="operator")

    check(lambda o: o.matmul, x, ref=T @ x)
    check(lambda o: o.matmul, X, ref=T @ X)
    check(lambda o: o.rmatmul, y, ref=T.T @ y)
    check(lambda o: o.rmatmul, Y, ref=T.T @ Y)
    check(lambda o: o.gram, ref=T.T @ T)
    check(lambda o: o.gram, w, ref=T.T @ (w[:, None] * T))
    check(lambda o: lambda: o.gram(format="dense"), ref=T.T @ T)
    check(lambda o: lambda: o.gram(format="sparse"), ref=T.T @ T)
    check(lambda o: o.col_sums, ref=T.sum(axis=0))
    check(lambda o: o.col_sums, w, ref=w @ T)
    check(lambda o: o.col_sq_sums, w, ref=w @ (T * T))
    check(lambda o: o.row_sq_norms, ref=(T * T).sum(axis=1))
    check(lambda o: o.row_sq_norms, cw, ref=(T * T) @ cw)
    check(lambda o: o.row_sums, ref=T.sum(axis=1))
    check(lambda o: lambda: o.take_rows(rows).matmul(x), ref=T[rows] @ x)
    check(lambda o: lambda: o.take_rows(rows).rmatmul(y[rows]), ref=T[rows].T @ y[rows])
    check(lambda o: lambda: o.materialize("dense"), ref=T)


def test_matmul_float32_stays_float32():
    ds = random_dataset(0, n_rows=40, scenario="left", dtype=np.float32)
    x = np.ones(ds.shape[1], dtype=np.float32)
    assert (ds @ x).dtype == np.float32
    assert (ds.T @ np.ones(len(ds), dtype=np.float32)).dtype == np.float32
    assert ds.gram().dtype == np.float32
    # A float64 right-hand side promotes, as NumPy does for the joined matrix.
    assert (ds @ x.astype(np.float64)).dtype == np.float64


def test_matmul_does_not_alias_or_mutate_inputs():
    ds = random_dataset(2, n_rows=30, scenario="star")
    x = np.arange(ds.shape[1], dtype=np.float64)
    x0 = x.copy()
    out1 = ds @ x
    out1 += 1.0
    out2 = ds @ x
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_allclose(out1 - 1.0, out2, rtol=1e-12)


@pytest.mark.parametrize(
    "scenario", ["left", "outer", "many_to_many", "sparse", "union"]
)
def test_matmul_over_several_row_blocks(scenario):
    # 400 right-hand-side columns make blocks of 1024 target rows: several blocks,
    # a partial last one, and -1 entries that straddle block boundaries.
    ds = random_dataset(5, n_rows=2600, scenario=scenario)
    T = np.asarray(ds.materialize("dense"))
    X = np.random.default_rng(0).standard_normal((ds.shape[1], 400))
    np.testing.assert_allclose(ds @ X, T @ X, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ds @ X[:, 0], T @ X[:, 0], rtol=1e-10, atol=1e-10)


def _sparse_operands(rng, n, dtype):
    """A general CSR (empty and multi-entry rows), a weighted one-hot, and a COO."""
    general = sp.random(n, 4, density=0.4, format="csr", rng=rng, dtype=dtype)
    labels = rng.integers(0, 3, n)
    one_hot = sp.csr_matrix(
        (rng.random(n).astype(dtype), labels, np.arange(n + 1)), shape=(n, 3)
    )
    return [general, one_hot, one_hot.tocoo()]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rmatmul_sparse_equals_dense(scenario):
    # The k-means M-step passes a sparse one-hot: every operator must give the
    # dense product (as a dense ndarray) for any sparse right-hand side.
    from ilargi_sklearn.multisource import AffineOperator

    ds = random_dataset(4, n_rows=50, scenario=scenario)
    op = ds.operator
    dtype = op.dtype
    rng = np.random.default_rng(7)
    n, m = op.shape
    scale = (rng.random(m) + 0.5).astype(dtype)
    offset = rng.standard_normal(m).astype(dtype)
    ops = [
        op,
        op.materialized(),
        AffineOperator(op, scale, offset),
        AffineOperator(op.materialized(), scale, offset),
        op.take_rows(rng.permutation(n)[: n - 5]),
    ]
    for o in ops:
        for Y in _sparse_operands(rng, o.n_rows, dtype):
            got = o.rmatmul(Y)
            ref = o.rmatmul(Y.toarray())
            assert isinstance(got, np.ndarray), type(got)
            assert got.shape == (m, Y.shape[1])
            assert got.dtype == ref.dtype == dtype
            assert_close(got, ref, dtype=dtype, kind="operator")


def test_rmatmul_sparse_wide_operand_stays_sparse():
    # A wide, very sparse Y (r * k far above its nnz) takes the sparse segment sum.
    ds = random_dataset(1, n_rows=40, scenario="left")
    op = ds.operator
    n = op.n_rows
    rng = np.random.default_rng(0)
    k = 200_000  # 6 source rows x k bins: above the dense segment-sum limit
    Y = sp.csr_matrix(
        (rng.standard_normal(12), (rng.integers(0, n, 12), rng.integers(0, k, 12))),
        shape=(n, k),
    )
    T = np.asarray(ds.materialize("dense"))
    got = op.rmatmul(Y)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, (Y.T @ T).T, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match=r"shape \(39, 3\)"):
        op.rmatmul(sp.csr_matrix((39, 3)))
