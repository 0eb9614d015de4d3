"""The NumPy fast paths' views of an operator: fused layouts and products into ``out``."""

import numpy as np
import pytest
from _helpers import dense, tolerance

from ilargi_sklearn.linear_model._least_squares import _solve_lsqr
from ilargi_sklearn.multisource import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
)
from ilargi_sklearn.multisource._operators import fused_layout, matmul_into
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

numba = pytest.importorskip("numba")


# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


# ---------------------------------------------------------------- fused layouts
def _layout_matrix(layout):
    """The matrix a layout describes, built densely (test helper)."""
    n, m = layout.shape
    T = np.zeros((n, m))
    if layout.base is not None:
        T[:, layout.base_cols] += dense(layout.base)
    for g in layout.groups:
        Z = np.vstack([dense(g.S), np.zeros((1, g.S.shape[1]))])
        T[:, g.cols] += Z[np.where(g.idx < 0, g.S.shape[0], g.idx)]
    if layout.offset is not None:
        T -= layout.offset
    if layout.scale is not None:
        T *= layout.scale
    return T


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_layout_describes_the_operator(scenario):
    ds = random_dataset(1, n_rows=80, scenario=scenario)
    op = ds.operator
    rng = np.random.default_rng(0)
    scale = rng.random(op.n_cols) + 0.5
    offset = rng.standard_normal(op.n_cols)
    sparse_cols = fused_layout(op).sparse_cols()
    assert (sparse_cols.size > 0) == (scenario == "sparse")
    if sparse_cols.size:
        # Centering a CSR source would densify it: no layout; elsewhere fine.
        assert fused_layout(AffineOperator(op, offset=offset)) is None
        offset[sparse_cols] = 0.0
    nested = AffineOperator(AffineOperator(op, scale=scale), offset=offset)
    for o in (op, AffineOperator(op, offset=offset), nested):
        layout = fused_layout(o)
        assert layout is not None
        T = _layout_matrix(layout)
        np.testing.assert_allclose(
            T, o.materialize("dense"), atol=tolerance(op.dtype, "compiled")
        )


def test_layout_is_none_where_kernels_do_not_apply():
    sparse = random_dataset(0, scenario="sparse").operator
    assert fused_layout(sparse) is not None
    offset = np.zeros(sparse.n_cols)
    offset[fused_layout(sparse).sparse_cols()[0]] = 1.0
    assert fused_layout(AffineOperator(sparse, offset=offset)) is None
    assert fused_layout(MatrixOperator(np.ones((4, 2)))) is None


# ------------------------------------------------------------ products with out=
@pytest.mark.parametrize("scenario", ["star", "left", "sparse", "float32"])
@pytest.mark.parametrize("k", [None, 3])
def test_matmul_out_is_filled_in_place(scenario, k):
    ds = random_dataset(6, n_rows=70, scenario=scenario)
    fm = ds.operator
    rng = np.random.default_rng(0)
    shape = fm.n_cols if k is None else (fm.n_cols, k)
    X = rng.standard_normal(shape).astype(fm.dtype)
    ops = [fm, fm.materialized(), AffineOperator(fm, offset=rng.random(fm.n_cols))]
    for op in ops:
        expected = op.materialize("dense") @ X
        out = np.full(expected.shape, np.nan, dtype=fm.dtype)
        got = matmul_into(op, X, out)
        assert got is out
        np.testing.assert_allclose(
            out, expected, atol=tolerance(fm.dtype, "compiled") * 10
        )


def test_matmul_out_with_wrong_shape_raises():
    fm = random_dataset(0, scenario="star").operator
    assert isinstance(fm, FactorizedMatrix)
    with pytest.raises(ValueError, match=r"out must be a C-contiguous ndarray"):
        fm.matmul(np.ones(fm.n_cols), out=np.empty(fm.n_rows + 1))


@pytest.mark.parametrize("scenario", ["left", "float32"])
def test_lsqr_with_workspaces_matches_the_materialized_fit(scenario):
    ds = random_dataset(7, n_rows=120, scenario=scenario)
    op = ds.operator
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((op.n_rows, 2))
    sw = rng.random(op.n_rows) + 0.5
    for weights in (None, sw):
        ours = _solve_lsqr(op, Y, weights, True, 1e-12)
        ref = _solve_lsqr(op.materialized(), Y, weights, True, 1e-12)
        tol = tolerance(op.dtype, "compiled") * 10
        np.testing.assert_allclose(ours[0], ref[0], rtol=tol, atol=tol)
        np.testing.assert_allclose(ours[1], ref[1], rtol=tol, atol=tol)
