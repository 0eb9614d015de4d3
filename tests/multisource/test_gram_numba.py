"""The gram's compiled cross tables (``multisource/_gram_numba.py``): equal to NumPy."""

import numpy as np
import pytest
from _helpers import dense, tolerance

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.multisource import (
    _gram_numba,
)
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

numba = pytest.importorskip("numba")

# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


# ------------------------------------------------------------- gram cross blocks
def test_cross_tables_match_numpy():
    rng = np.random.default_rng(4)
    n, m = 3000, 40
    idx = rng.integers(-1, m, n)
    Zb = rng.standard_normal((25, 3))
    gb = rng.integers(-1, 25, n)
    S0 = rng.standard_normal((n, 2))
    w = rng.random(n)
    for weights in (None, w):
        got = _gram_numba.fused_cross_tables(idx, m, [(S0, None), (Zb, gb)], weights)
        s = np.ones(n) if weights is None else weights
        rows_b = np.where(gb[:, None] >= 0, Zb[gb], 0.0)
        want = np.zeros((m, 5))
        keep = idx >= 0
        np.add.at(want, idx[keep], (s[:, None] * np.hstack([S0, rows_b]))[keep])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gram_with_compiled_cross_blocks_equals_numpy(scenario, monkeypatch):
    ds = random_dataset(5, scenario=scenario, n_rows=400)
    op = ds.operator
    w = np.random.default_rng(1).random(len(ds))
    compiled = op._compiled_cross_blocks(None)
    if scenario != "sparse":
        assert compiled, "the dense scenarios have pairs for the compiled pass"
    for weights in (None, w):
        got = op.gram(weights, format="dense")
        monkeypatch.setenv(_launcher.NO_NUMBA_ENV, "1")
        assert op._compiled_cross_blocks(weights) == {}
        want = op.gram(weights, format="dense")
        monkeypatch.delenv(_launcher.NO_NUMBA_ENV)
        assert got.dtype == want.dtype
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(
            got, want, atol=tolerance(op.dtype, "compiled") * scale
        )


def test_compiled_cross_pass_skips_anchors_of_low_tuple_ratio():
    from ilargi_sklearn.datasets import make_multi_source

    low = make_multi_source(n_rows=20_000, tuple_ratio=2, random_state=0).dataset
    high = make_multi_source(n_rows=20_000, tuple_ratio=10, random_state=0).dataset
    assert low.operator._compiled_cross_blocks(None) == {}
    assert len(high.operator._compiled_cross_blocks(None)) == 3
    np.testing.assert_allclose(
        high.operator.gram(format="dense"),
        dense(high).T @ dense(high),
        rtol=1e-9,
        atol=1e-9 * np.abs(dense(high)).max() ** 2 * 20_000,
    )
