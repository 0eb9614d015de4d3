"""MultiSourceDataset built from matrices: factorized operators equal materialized ones.

The reference joined matrix is built here cell by cell from the definition of
DESIGN.md 2 (index vectors, column mappings and the ownership rule of 2.1), independently
of the library's term construction.
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, dense
from hypothesis import given
from hypothesis import strategies as st

from ilargi_sklearn.multisource import (
    FactorizedMatrix,
    MultiSourceDataset,
    Operator,
    as_operator,
)
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

DTYPES = [np.float64, np.float32]


def reference_join(sources, idxs, colmaps, n_rows, n_cols, priority=None):
    """The joined matrix from the definition, one cell at a time.

    A target cell takes the value of the highest-priority source that maps a column to
    it and matches the row; cells no source covers are 0.
    """
    n_sources = len(sources)
    order = list(priority or []) + [
        k for k in range(n_sources) if k not in (priority or [])
    ]
    parts = [dense(S) for S in sources]
    T = np.zeros((n_rows, n_cols))
    for c in range(n_cols):
        for i in range(n_rows):
            for k in order:
                cols = np.flatnonzero(colmaps[k] == c)
                row = i if idxs[k] is None else idxs[k][i]
                if cols.size and row >= 0:
                    T[i, c] = parts[k][row, cols[0]]
                    break
    return T


@st.composite
def matrix_schemas(draw):
    """Sources, indicators (index vectors or sparse binary) and mappings."""
    n_rows = draw(st.integers(1, 25))
    n_sources = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    has_base = draw(st.booleans())
    overlap = draw(st.booleans())
    sources, indicators, idxs, colmaps = [], [], [], []
    n_cols = 0
    for k in range(n_sources):
        base = has_base and k == 0
        r = n_rows if base else draw(st.integers(1, 8))
        c = draw(st.integers(1, 4))
        kind = draw(st.sampled_from(["dense", "sparse", "onehot"]))
        if kind == "dense":
            S = rng.standard_normal((r, c)) * 3
        elif kind == "sparse":
            S = sp.random(r, c, density=0.4, random_state=rng, format="csr")
            S.data = rng.standard_normal(S.data.shape[0])
            if draw(st.booleans()):
                S = S.tocoo()
        else:
            codes = rng.integers(0, c, r)
            S = sp.csr_matrix((np.ones(r), (np.arange(r), codes)), shape=(r, c))
        sources.append(S)
        if base:
            idx = None
            indicators.append(None)
        else:
            idx = rng.integers(0, r, n_rows)
            miss = draw(st.sampled_from([0.0, 0.3, 1.0]))
            idx[rng.random(n_rows) < miss] = -1
            form = draw(st.sampled_from(["index", "index32", "sparse"]))
            if form == "index":
                indicators.append(idx.copy())
            elif form == "index32":
                indicators.append(idx.astype(np.int32))
            else:
                hit = idx >= 0
                indicators.append(
                    sp.csr_matrix(
                        (np.ones(int(hit.sum())), (np.flatnonzero(hit), idx[hit])),
                        shape=(n_rows, r),
                    )
                )
        idxs.append(idx)
        if overlap and n_cols:
            # Send each column to a fresh column, an existing one (shared) or nowhere.
            cm = np.empty(c, dtype=np.int64)
            taken: set[int] = set()
            earlier = n_cols  # columns of earlier sources only
            for j in range(c):
                choice = draw(st.sampled_from(["new", "shared", "unused"]))
                free = [t for t in range(earlier) if t not in taken]
                if choice == "shared" and free:
                    cm[j] = draw(st.sampled_from(free))
                    taken.add(int(cm[j]))
                elif choice == "unused":
                    cm[j] = -1
                else:
                    cm[j] = n_cols
                    n_cols += 1
        else:
            cm = np.arange(n_cols, n_cols + c)
            n_cols += c
        colmaps.append(cm)
    # The first source maps all its columns, so no target column is left uncovered.
    priority = None
    if overlap and draw(st.booleans()):
        priority = list(draw(st.permutations(range(n_sources))))
    dtype = draw(st.sampled_from(DTYPES))
    return {
        "sources": sources,
        "indicators": indicators,
        "idxs": idxs,
        "colmaps": colmaps,
        "mappings": colmaps if overlap or draw(st.booleans()) else None,
        "n_rows": n_rows,
        "n_cols": n_cols,
        "priority": priority,
        "dtype": dtype,
        "seed": seed,
    }


@given(schema=matrix_schemas())
def test_from_matrices_equals_definition(schema, check_operators):
    sources = schema["sources"]
    before = [
        (S.toarray().copy(), type(S)) if sp.issparse(S) else (S.copy(), type(S))
        for S in sources
    ]
    ind_before = [None if i is None else dense(i).copy() for i in schema["indicators"]]
    ds = MultiSourceDataset.from_matrices(
        sources,
        schema["indicators"],
        schema["mappings"],
        priority=schema["priority"],
        dtype=schema["dtype"],
    )
    assert ds.shape == (schema["n_rows"], schema["n_cols"])
    assert ds.dtype == schema["dtype"]
    assert len(ds.feature_names) == schema["n_cols"]
    assert ds.n_sources == len(sources)
    T = reference_join(
        sources,
        schema["idxs"],
        schema["colmaps"],
        schema["n_rows"],
        schema["n_cols"],
        schema["priority"],
    )
    M = check_operators(ds, schema["seed"])
    assert_close(
        M, T, bound=T, dtype=ds.dtype, err_msg="materialize() vs the definition"
    )
    # The caller's matrices and indicators are left as they were.
    for S, (S0, kind) in zip(sources, before):
        assert type(S) is kind
        np.testing.assert_array_equal(dense(S), S0)
    for i, i0 in zip(schema["indicators"], ind_before):
        if i is not None:
            np.testing.assert_array_equal(dense(i), i0)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("n_sources", [1, 2, 4])
def test_random_dataset_scenarios(scenario, n_sources, check_operators):
    ds = random_dataset(
        7 + n_sources, n_rows=40, n_sources=n_sources, scenario=scenario
    )
    if scenario == "float32":
        assert ds.dtype == np.float32
    check_operators(ds, n_sources)


def _assert_canonical_join(A, dense):
    assert sp.isspmatrix_csr(A) and A.dtype == dense.dtype
    assert A.has_sorted_indices and A.indptr.dtype == A.indices.dtype
    assert np.all(A.data != 0) and A.nnz == np.count_nonzero(dense)
    B = A.copy()
    B.sum_duplicates()
    assert B.nnz == A.nnz  # no duplicate entries
    np.testing.assert_array_equal(A.toarray(), dense)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sparse_materialize_is_the_canonical_join(scenario):
    # Every scenario (dense and sparse sources, missing matches, overlapping
    # columns whose ownership interleaves the terms' columns, unions), and a row
    # slice of it: the CSR join equals the dense one, in canonical form.
    ds = random_dataset(5, n_rows=300, n_sources=4, scenario=scenario)
    for part in (ds, ds[np.random.default_rng(0).permutation(len(ds))[:77]]):
        _assert_canonical_join(part.materialize("sparse"), part.materialize("dense"))
    # A source with an explicit zero is stored without it.
    zeroed = ds * 0.0
    _assert_canonical_join(zeroed.materialize("sparse"), zeroed.materialize("dense"))


def test_sparse_materialize_with_interleaved_columns_and_explicit_zeros():
    # Terms whose columns interleave (and one whose column map is not increasing)
    # leave rows out of column order until the final sort; a stored zero of a
    # source is not stored in the join.
    from ilargi_sklearn._backend import RowMap
    from ilargi_sklearn.multisource._operators import Term

    rng = np.random.default_rng(2)
    n = 50
    A = sp.random(8, 3, density=0.6, random_state=rng, format="csr")
    A.data[0] = 0.0  # an explicit zero
    B = rng.standard_normal((n, 2))
    B[::3, 0] = 0.0
    idx = rng.integers(-1, 8, n)
    fm = FactorizedMatrix(
        [
            Term(A, RowMap(idx, 8), np.array([4, 0, 2]), 0),
            Term(B, RowMap(None, n), np.array([1, 3]), 1),
        ],
        n,
        5,
        np.float64,
    )
    _assert_canonical_join(fm.materialize("sparse"), fm.materialize("dense"))
    assert A.nnz == np.count_nonzero(A.data) + 1  # the source is left as it was


def test_sparse_materialize_peak_is_close_to_its_result():
    # The CSR join is written once at its final size: the peak of the call stays
    # near the bytes it returns (per-term COO pieces, concatenated and converted,
    # would peak at about five times them).
    import tracemalloc

    rng = np.random.default_rng(1)
    n, r = 60_000, 500
    hot = sp.random(r, 300, density=0.05, random_state=rng, format="csr")
    base = sp.random(n, 20, density=0.2, random_state=rng, format="csr")
    ds = MultiSourceDataset.from_matrices(
        [base, hot, hot], [None, rng.integers(0, r, n), rng.integers(-1, r, n)]
    )
    tracemalloc.start()
    try:
        A = ds.materialize("sparse")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = A.data.nbytes + A.indices.nbytes + A.indptr.nbytes
    assert result > 10e6
    assert peak < 1.3 * result, (peak, result)


@pytest.mark.parametrize("dtype", DTYPES)
def test_astype_preserved_by_every_operator(dtype, check_operators):
    ds = random_dataset(3, n_rows=30, scenario="sparse").astype(dtype)
    assert ds.dtype == dtype
    assert ds.astype(dtype) is ds
    # check_operators asserts the dtype of every result (products, reductions,
    # scalar maps, slices) against the dataset's dtype.
    check_operators(ds, 1)
    back = ds.astype(np.float64)
    assert back.dtype == np.float64
    np.testing.assert_allclose(
        back.materialize("dense"), ds.materialize("dense").astype(np.float64)
    )


# ----------------------------------------------------------- ownership (DESIGN 2.1)
def _overlap_pair(priority=None, miss=None):
    """Two sources that both supply target column 0 ("weight")."""
    base = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])  # weight, a
    meas = np.array([[100.0, 7.0], [200.0, 8.0]])  # weight, b
    idx = np.array([0, 1, 1, 0]) if miss is None else miss
    return MultiSourceDataset.from_matrices(
        [base, meas],
        [None, idx],
        [np.array([0, 1]), np.array([0, 2])],
        ["weight", "a", "b"],
        priority=priority,
    )


def test_overlapping_column_not_doubled(check_operators):
    """The published implementation summed both sources' values (DESIGN 8.1)."""
    ds = _overlap_pair()
    expected = np.array(
        [[1.0, 10.0, 7.0], [2.0, 20.0, 8.0], [3.0, 30.0, 8.0], [4.0, 40.0, 7.0]]
    )
    M = check_operators(ds)
    np.testing.assert_allclose(M, expected)
    e0 = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(ds @ e0, [1.0, 2.0, 3.0, 4.0])  # not 101, 202, ...
    np.testing.assert_allclose(ds.sum(axis=0)[0], 10.0)
    np.testing.assert_allclose(ds.gram()[0, 0], 1 + 4 + 9 + 16)
    np.testing.assert_allclose(ds.row_norms(), (expected**2).sum(axis=1))
    np.testing.assert_allclose((ds**2).materialize()[:, 0], [1.0, 4.0, 9.0, 16.0])


def test_ownership_priority_and_fallback(check_operators):
    # The second source first: it owns "weight" wherever it matched ...
    ds = _overlap_pair(priority=[1, 0], miss=np.array([0, -1, 1, -1]))
    M = check_operators(ds)
    # ... and the base supplies it only where the measurement is missing.
    np.testing.assert_allclose(M[:, 0], [100.0, 2.0, 200.0, 4.0])
    np.testing.assert_allclose(M[:, 2], [7.0, 0.0, 8.0, 0.0])
    # Default priority: the base (first source) owns every row it matches.
    ds = _overlap_pair(miss=np.array([0, -1, 1, -1]))
    np.testing.assert_allclose(check_operators(ds)[:, 0], [1.0, 2.0, 3.0, 4.0])


def test_ownership_between_two_left_joins(check_operators):
    a = np.array([[1.0], [2.0]])
    b = np.array([[10.0], [20.0], [30.0]])
    ia = np.array([0, -1, 1, -1, 0])
    ib = np.array([2, 1, -1, -1, 0])
    ds = MultiSourceDataset.from_matrices(
        [a, b], [ia, ib], [np.array([0]), np.array([0])], ["x"]
    )
    np.testing.assert_allclose(check_operators(ds)[:, 0], [1.0, 20.0, 2.0, 0.0, 1.0])
    ds = MultiSourceDataset.from_matrices(
        [a, b], [ia, ib], [np.array([0]), np.array([0])], ["x"], priority=[1]
    )
    np.testing.assert_allclose(check_operators(ds)[:, 0], [30.0, 20.0, 2.0, 0.0, 10.0])


# ---------------------------------------------------------------------- unions
@given(
    seed=st.integers(0, 10_000),
    scenario=st.sampled_from([s for s in SCENARIOS if s != "union"]),
    n_parts=st.integers(1, 3),
)
def test_union_stacks_rows(seed, scenario, n_parts, check_operators):
    ds = random_dataset(seed, n_rows=12, n_sources=3, scenario=scenario)
    rng = np.random.default_rng(seed)
    parts = [ds] + [ds[rng.integers(0, len(ds), 5)] for _ in range(n_parts - 1)]
    u = MultiSourceDataset.union(parts)
    assert len(u) == sum(len(p) for p in parts)
    assert u.n_sources == sum(p.n_sources for p in parts)
    assert list(u.feature_names) == list(ds.feature_names)
    expected = np.vstack([p.materialize("dense") for p in parts])
    M = check_operators(u, seed)
    assert_close(
        M, expected, bound=expected, dtype=ds.dtype, err_msg="union materialize"
    )
    # The joined sources are shared, not copied: the union adds index vectors
    # (a slice gathers only its base rows, which keeps the identity fast paths).
    joined = {id(t.S) for t in ds.operator.terms if not t.rows.is_identity}
    assert joined <= {id(t.S) for t in u.operator.terms}


def test_union_rejects_other_schemas():
    a = random_dataset(0, n_rows=10, scenario="star")
    b = MultiSourceDataset.from_matrices([np.ones((4, a.shape[1]))], [None])
    with pytest.raises(ValueError, match="same feature names and dtype"):
        MultiSourceDataset.union([a, b])
    with pytest.raises(ValueError, match="same feature names and dtype"):
        MultiSourceDataset.union([a, a.astype(np.float32)])
    with pytest.raises(ValueError, match="at least one dataset"):
        MultiSourceDataset.union([])
    with pytest.raises(TypeError, match="union takes MultiSourceDatasets"):
        MultiSourceDataset.union([a, a.materialize()])
    with pytest.raises(TypeError, match="unscaled"):
        MultiSourceDataset.union([a * 2.0, a])


# ------------------------------------------------------- protocol and behaviour
def test_operator_protocol_and_materialized_plan():
    ds = random_dataset(5, n_rows=30, scenario="left")
    op = ds.operator
    assert isinstance(op, FactorizedMatrix) and isinstance(op, Operator)
    assert as_operator(ds) is op
    mat = op.materialized()
    rng = np.random.default_rng(0)
    W = rng.standard_normal((ds.shape[1], 2))
    np.testing.assert_allclose(mat.matmul(W), op.matmul(W), rtol=1e-12, atol=1e-12)
    assert as_operator(ds.materialize()).shape == ds.shape


@pytest.mark.parametrize("scenario", ["star", "overlap", "sparse", "union", "float32"])
def test_pickle_round_trip(scenario):
    ds = random_dataset(11, n_rows=25, scenario=scenario)
    ds.operator.matmul(np.ones((ds.shape[1], 3), dtype=ds.dtype))  # fill the caches
    back = pickle.loads(pickle.dumps(ds))
    assert type(back) is MultiSourceDataset
    assert back.shape == ds.shape and back.dtype == ds.dtype
    assert list(back.feature_names) == list(ds.feature_names)
    assert back.source_names == ds.source_names
    M = ds.materialize("dense")
    assert_close(
        back.materialize("dense"),
        M,
        bound=M,
        dtype=ds.dtype,
        err_msg="pickled materialize",
    )
    w = np.linspace(-1, 1, ds.shape[1]).astype(ds.dtype)
    assert_close(
        back @ w,
        ds @ w,
        bound=np.abs(M) @ np.abs(w),
        dtype=ds.dtype,
        err_msg="pickled ds @ w",
    )
    assert_close(
        back[::3].gram(format="dense"),
        ds[::3].gram(format="dense"),
        bound=np.abs(M[::3]).T @ np.abs(M[::3]),
        dtype=ds.dtype,
        err_msg="pickled slice gram",
    )
    # A scaled dataset pickles too.
    s = pickle.loads(pickle.dumps(ds * 2.0))
    assert_close(
        s.materialize("dense"),
        2 * M,
        bound=2 * np.abs(M),
        dtype=ds.dtype,
        err_msg="pickled ds * 2",
    )


def _source_bytes(S):
    if sp.issparse(S):
        return S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
    return S.nbytes


def test_describe_figures():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 3))
    base[base < -1] = 0.0
    dim = sp.random(6, 5, density=0.5, random_state=rng, format="csr")
    dim2 = rng.integers(0, 3, (4, 2)).astype(np.float64)  # zeros in a dense source
    i1 = rng.integers(0, 6, 40)
    i2 = rng.integers(0, 4, 40)
    i2[:7] = -1
    ds = MultiSourceDataset.from_matrices(
        [base, dim, dim2], [None, i1, i2], source_names=["fact", "dim", "dim2"]
    )
    desc = ds.describe()
    t = desc.sources
    assert list(t.index) == ["fact", "dim", "dim2"]
    np.testing.assert_array_equal(t["rows"], [40, 6, 4])
    np.testing.assert_array_equal(t["columns"], [3, 5, 2])
    np.testing.assert_array_equal(
        t["nnz"], [np.count_nonzero(base), dim.nnz, np.count_nonzero(dim2)]
    )
    np.testing.assert_array_equal(
        t["bytes"], [_source_bytes(base), _source_bytes(dim), _source_bytes(dim2)]
    )
    np.testing.assert_allclose(t["tuple_ratio"], [1.0, 40 / 6, 10.0])
    np.testing.assert_allclose(t["feature_ratio"], [1.0, 5 / 3, 2 / 3])
    np.testing.assert_allclose(t["matched"], [1.0, 1.0, 33 / 40])
    s = desc.summary
    M = ds.materialize("dense")
    assert (s["n_rows"], s["n_features"], s["n_sources"]) == (40, 10, 3)
    assert s["nnz_joined"] == np.count_nonzero(M) == ds.materialize("sparse").nnz
    assert s["nnz_sources"] == int(t["nnz"].sum())
    assert (
        s["bytes_factorized"]
        == ds.nbytes
        == int(t["bytes"].sum()) + i1.nbytes + i2.nbytes
    )
    assert s["bytes_dense"] == M.nbytes
    assert s["materialized_format"] == "CSR"
    assert s["bytes_materialized"] == s["bytes_csr"]
    np.testing.assert_allclose(s["bytes_ratio"], s["bytes_csr"] / ds.nbytes)
    np.testing.assert_allclose(s["nnz_ratio"], s["nnz_joined"] / s["nnz_sources"])
    text = str(desc)
    assert "40 rows x 10 features" in text and "dim2" in text


def test_describe_counts_explicit_zeros_of_sparse_inputs_as_zeros():
    S = sp.csr_matrix((np.array([1.0, 0.0, 3.0]), [0, 1, 2], [0, 3]), shape=(1, 3))
    ds = MultiSourceDataset.from_matrices([S], [np.zeros(4, dtype=np.int64)])
    assert ds.describe().summary["nnz_joined"] == ds.materialize().nnz == 8
    assert ds.describe().sources["nnz"].iloc[0] == 2
    assert S.nnz == 3  # the caller's matrix keeps its explicit zero


def test_repr_is_short_and_informative():
    ds = random_dataset(0, n_rows=50, n_sources=3, scenario="sparse")
    r = repr(ds)
    assert r.startswith("MultiSourceDataset(") and r.endswith(")")
    assert "\n" not in r and len(r) < 200
    assert f"{len(ds):,} rows x {ds.shape[1]} features" in r
    assert "3 sources" in r and "float64" in r
    assert "scaled" in repr(ds * 2.0)
    assert repr(ds.T).endswith(".T")


def test_array_conversion_raises_naming_materialize():
    ds = random_dataset(0, n_rows=10)
    with pytest.raises(TypeError, match=r"materialize\(\)"):
        np.asarray(ds)
    with pytest.raises(TypeError, match=r"materialize\(\)"):
        np.array(ds)


@pytest.mark.parametrize(
    "op",
    [
        lambda ds: ds + 1.0,
        lambda ds: 1.0 + ds,
        lambda ds: ds - 1.0,
        lambda ds: 1.0 - ds,
        lambda ds: ds + np.ones(ds.shape[1]),
    ],
)
def test_shift_raises(op):
    ds = random_dataset(0, n_rows=10)
    with pytest.raises(TypeError, match="zero cells of unmatched rows"):
        op(ds)


@pytest.mark.parametrize("p", [-1, 0, -0.5])
def test_non_positive_power_raises(p):
    ds = random_dataset(0, n_rows=10)
    with pytest.raises(ValueError, match=re.escape(f"ds ** {p!r}")):
        ds**p


def test_scalar_maps_reject_non_scalars():
    ds = random_dataset(0, n_rows=10)
    with pytest.raises(TypeError, match="scalar multiplication only"):
        ds * np.ones(ds.shape[1])
    with pytest.raises(TypeError, match="scalar multiplication only"):
        ds * "2"
    with pytest.raises(ZeroDivisionError, match="by zero"):
        ds / 0
    with pytest.raises(ValueError, match="scaled or centered"):
        (ds * 2.0) ** 2
    # Composition of scalings multiplies the scales.
    np.testing.assert_allclose(
        ((ds * 2.0) / 4.0).materialize("dense"), ds.materialize("dense") / 2.0
    )


def test_transposed_view():
    ds = random_dataset(2, n_rows=15)
    M = ds.materialize("dense")
    assert ds.T.shape == M.T.shape
    assert ds.T.T is ds
    X = np.random.default_rng(0).standard_normal((3, ds.shape[1]))
    np.testing.assert_allclose(X @ ds.T, X @ M.T, rtol=1e-10, atol=1e-10)
    x = X[0]
    np.testing.assert_allclose(x @ ds.T, M @ x, rtol=1e-10, atol=1e-10)
    with pytest.raises(TypeError, match="two MultiSourceDatasets"):
        ds @ ds
