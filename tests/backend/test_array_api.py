"""Operators on array_api_strict arrays on a non-default device equal the NumPy ones.

``array_api_strict`` refuses silent conversion to NumPy, mixing devices and fancy
indexing, as CuPy does: every result must come back in that namespace, on that
device, and agree with the NumPy/SciPy fast paths.
"""

import numpy as np
import pytest
from _helpers import assert_close, strict_namespace

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn._backend import RowMap
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_numpy_namespace,
    to_numpy,
)
from ilargi_sklearn._backend._ops import segment_sum
from ilargi_sklearn.multisource import AffineOperator, MatrixOperator
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

xps, DEV = strict_namespace()
DENSE = [s for s in SCENARIOS if s != "sparse"]


def _check(expected, got, dtype, what):
    assert get_namespace(got) is xps, what
    assert device_of(got) == DEV, what
    assert_close(got, expected, dtype=dtype, kind="device", err_msg=what)


def test_namespace_helpers():
    a = np.arange(4.0)
    assert is_numpy_namespace(get_namespace(a, None, 2.0))
    d = asarray_on(a, xps, DEV)
    assert get_namespace(d) is xps and device_of(d) == DEV
    np.testing.assert_array_equal(to_numpy(d), a)
    with pytest.raises(TypeError, match="mix array namespaces"):
        get_namespace(a, d)
    with pytest.raises(TypeError, match="no sparse"):
        import scipy.sparse as sp

        asarray_on(sp.eye(3, format="csr"), xps, DEV)


@pytest.mark.parametrize("k", [None, 3])
def test_segment_sum_and_gather_fallback(k):
    rng = np.random.default_rng(0)
    idx = rng.integers(-1, 7, 50)
    Y = rng.standard_normal(50 if k is None else (50, k))
    rm = RowMap(idx, 7)
    dm = rm.to_namespace(xps, DEV)
    Yd = asarray_on(Y, xps, DEV)
    _check(rm.scatter(Y), dm.scatter(Yd), np.float64, "scatter")
    _check(rm.scatter(Y), segment_sum(Yd, dm._idx, 7), np.float64, "operator")
    Z = rng.standard_normal(7 if k is None else (7, k))
    _check(rm.gather(Z), dm.gather(asarray_on(Z, xps, DEV)), np.float64, "gather")
    _check(
        rm.counts(Y[:, 0] if k else Y),
        dm.counts(Yd[:, 0] if k else Yd),
        np.float64,
        "counts",
    )
    rows = rng.permutation(50)[:20]
    _check(
        rm.take(rows).gather(Z),
        dm.take(rows).gather(asarray_on(Z, xps, DEV)),
        np.float64,
        "take",
    )
    assert str(dm._idx.dtype).endswith("int32")


@pytest.mark.parametrize("scenario", DENSE)
def test_factorized_operator_on_strict_device(scenario):
    ds = random_dataset(3, scenario=scenario)
    dd = ds.to_device(DEV, namespace=xps)
    assert dd.device == DEV
    op, od = ds.operator, dd.operator
    dt = ds.dtype
    rng = np.random.default_rng(1)
    X = rng.standard_normal((ds.shape[1], 3))
    Y = rng.standard_normal((len(ds), 2))
    w = rng.random(len(ds))
    Xd, Yd, wd = (asarray_on(a, xps, DEV) for a in (X, Y, w))
    _check(op.matmul(X), od.matmul(Xd), dt, "matmul")
    _check(op.matmul(X[:, 0]), od.matmul(Xd[:, 0]), dt, "matvec")
    _check(op.rmatmul(Y), od.rmatmul(Yd), dt, "rmatmul")
    _check(op.rmatmul(Y[:, 0]), od.rmatmul(Yd[:, 0]), dt, "rmatvec")
    _check(op.gram(format="dense"), od.gram(format="dense"), dt, "gram")
    _check(op.gram(w, format="dense"), od.gram(wd, format="dense"), dt, "wgram")
    _check(op.col_sums(), od.col_sums(), dt, "col_sums")
    _check(op.col_sums(w), od.col_sums(wd), dt, "wcol_sums")
    _check(op.col_sq_sums(w), od.col_sq_sums(wd), dt, "col_sq_sums")
    _check(op.row_sq_norms(), od.row_sq_norms(), dt, "row_sq_norms")
    _check(op.row_sums(), od.row_sums(), dt, "row_sums")
    _check(op.materialize("dense"), od.materialize("dense"), dt, "materialize")
    _check(
        op.gram(w, format="dense"),
        od.materialized().gram(wd, format="dense"),
        dt,
        "materialized gram",
    )
    assert od.nnz() == op.nnz()
    rows = rng.permutation(len(ds))[:20]
    _check(op.take_rows(rows).matmul(X), od.take_rows(rows).matmul(Xd), dt, "take")

    a = AffineOperator(
        op, rng.random(ds.shape[1]) + 0.5, rng.standard_normal(ds.shape[1])
    )
    ad = a.to_namespace(xps, DEV)
    _check(a.matmul(X), ad.matmul(Xd), dt, "affine matmul")
    _check(a.rmatmul(Y), ad.rmatmul(Yd), dt, "affine rmatmul")
    _check(a.rmatmul(Y[:, 0]), ad.rmatmul(Yd[:, 0]), dt, "affine rmatvec")
    _check(a.gram(w, format="dense"), ad.gram(wd, format="dense"), dt, "affine gram")
    _check(a.col_sums(w), ad.col_sums(wd), dt, "affine col_sums")
    _check(a.col_sq_sums(w), ad.col_sq_sums(wd), dt, "affine col_sq_sums")
    _check(a.row_sq_norms(), ad.row_sq_norms(), dt, "affine row_sq_norms")
    _check(a.materialize("dense"), ad.materialize("dense"), dt, "affine materialize")


def test_to_device_moves_once_and_slices_share_the_copy():
    ds = random_dataset(4, scenario="left")
    dd = ds.to_device(DEV, namespace=xps)
    assert ds.to_device(DEV, namespace=xps) is dd
    assert dd.to_device(DEV, namespace=xps) is dd
    rows = np.arange(0, len(ds), 2)
    # A fold of the CPU dataset takes its rows from the cached device copy.
    fold = ds[rows].to_device(DEV, namespace=xps)
    # (The base's rows are gathered from the copy; the joined sources are shared.)
    assert fold.operator.source_of_term(0) is dd.operator.terms[0].S
    for a, b in zip(fold.operator.terms, dd.operator.terms):
        assert a.rows.is_identity or a.S is b.S
    Y = np.random.default_rng(0).standard_normal(rows.shape[0])
    _check(
        ds[rows].operator.rmatmul(Y),
        fold.operator.rmatmul(asarray_on(Y, xps, DEV)),
        ds.dtype,
        "fold rmatmul",
    )
    # And back: the original host dataset, not a copy.
    assert dd.to_device("cpu").operator is ds.operator
    np.testing.assert_allclose(
        fold.to_device("cpu").materialize(), ds[rows].materialize(), rtol=1e-12
    )


def test_from_matrices_keeps_strict_inputs_on_their_device():
    rng = np.random.default_rng(5)
    base = rng.standard_normal((8, 2))
    dim = rng.standard_normal((3, 2))
    idx = rng.integers(-1, 3, 8)
    host = MultiSourceDataset.from_matrices([base, dim], [None, idx])
    dev = MultiSourceDataset.from_matrices(
        [asarray_on(base, xps, DEV), asarray_on(dim, xps, DEV)],
        [None, asarray_on(idx, xps, DEV)],
        dtype=np.float32,
    )
    assert dev.device == DEV and dev.dtype == np.float32
    _check(host.materialize(), dev.operator.materialize("dense"), np.float32, "build")
    bad = asarray_on(np.array([[1.0], [np.nan], [0.0]]), xps, DEV)
    with pytest.raises(ValueError, match="NaN"):
        MultiSourceDataset.from_matrices([asarray_on(base, xps, DEV), bad], [None, idx])


def test_matrix_operator_on_strict_device():
    rng = np.random.default_rng(2)
    A = rng.standard_normal((30, 4))
    w = rng.random(30)
    op, od = MatrixOperator(A), MatrixOperator(asarray_on(A, xps, DEV))
    wd = asarray_on(w, xps, DEV)
    _check(op.gram(w), od.gram(wd), np.float64, "gram")
    _check(op.col_sq_sums(w), od.col_sq_sums(wd), np.float64, "col_sq_sums")
    _check(op.row_sq_norms(), od.row_sq_norms(), np.float64, "row_sq_norms")
    _check(op.take_rows([3, 1]).A, od.take_rows([3, 1]).A, np.float64, "take")
    assert od.to_namespace(get_namespace()).A.shape == (30, 4)
