"""The CUDA segment sums against NumPy (every kernel variant), on a GPU.

Skips with the probe's reason where no usable GPU exists.
"""

import numpy as np
import pytest
from _helpers import gpu_marks

from ilargi_sklearn._backend import _cuda
from ilargi_sklearn._backend._namespace import get_namespace
from ilargi_sklearn._backend._ops import RowMap

pytestmark = gpu_marks()


def _want(idx, m, Z, gather=None, weights=None):
    rows = Z if gather is None else np.where(gather[:, None] >= 0, Z[gather], 0)
    if weights is not None:
        rows = rows * weights[:, None]
    out = np.zeros((m, Z.shape[1]))
    np.add.at(out, idx[idx >= 0], rows[idx >= 0])
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 9])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("index", [np.int32, np.int64])
@pytest.mark.parametrize("mode", ["plain", "weighted", "gathered", "both"])
def test_segment_sum_matches_numpy(k, dtype, index, mode):
    import cupy

    rng = np.random.default_rng(k)
    m, n, mb = 50, 30_000, 70
    idx = rng.integers(-1, m, n).astype(index)
    idx[:5000] = 7  # a segment of several warps (CHUNK rows each)
    w = rng.random(n) if mode in ("weighted", "both") else None
    g = rng.integers(-1, mb, n).astype(index) if mode in ("gathered", "both") else None
    Z = rng.standard_normal((n if g is None else mb, k)).astype(dtype)
    rows = _cuda.sorted_rows(cupy.asarray(idx), m)
    got = _cuda.segment_sum(
        rows,
        cupy.asarray(Z),
        gather=None if g is None else cupy.asarray(g),
        weights=None if w is None else cupy.asarray(w),
    )
    assert got.dtype == dtype and got.shape == (m, k)
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(
        cupy.asnumpy(got), _want(idx, m, Z.astype(np.float64), g, w), rtol=tol, atol=tol
    )
    np.testing.assert_array_equal(
        cupy.asnumpy(rows.counts()), np.bincount(idx[idx >= 0], minlength=m)
    )


def test_vector_and_empty():
    import cupy

    idx = cupy.asarray(np.array([2, -1, 2, 0, 2], dtype=np.int32))
    rows = _cuda.sorted_rows(idx, 4)
    got = _cuda.segment_sum(rows, cupy.asarray([1.0, 2.0, 4.0, 8.0, 16.0]))
    np.testing.assert_array_equal(cupy.asnumpy(got), [8.0, 0.0, 21.0, 0.0])
    none = _cuda.sorted_rows(cupy.full(3, -1, dtype=cupy.int32), 2)
    assert none.n_tasks == 0
    np.testing.assert_array_equal(
        cupy.asnumpy(_cuda.segment_sum(none, cupy.ones((3, 2)))), np.zeros((2, 2))
    )


def test_row_map_uses_segments_and_matches_host():
    import cupy

    rng = np.random.default_rng(3)
    idx = rng.integers(-1, 100, 20_000)
    host = RowMap(idx, 100)
    dev = host.to_namespace(get_namespace(cupy.zeros(1)))
    assert dev._sorted() is not None
    Y = rng.standard_normal((20_000, 3))
    np.testing.assert_allclose(
        cupy.asnumpy(dev.scatter(cupy.asarray(Y))), host.scatter(Y), rtol=1e-12
    )
    np.testing.assert_allclose(cupy.asnumpy(dev.counts()), host.counts())
    assert dev.counts() is dev.counts()  # cached
    other = RowMap(rng.integers(-1, 30, 20_000), 30)
    Z = rng.standard_normal((30, 4))
    w = rng.random(20_000)
    want = host.scatter(other.gather(Z) * w[:, None])
    got = dev.cross(other.to_namespace(dev.xp), cupy.asarray(Z), cupy.asarray(w))
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-11, atol=1e-11)
