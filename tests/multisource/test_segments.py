"""The segmentation behind the CUDA segment sums, checked with NumPy.

The kernel itself needs a GPU (``tests/gpu/test_segments.py``); the grouping of
target rows into per-warp tasks is plain array code and runs here on NumPy, with a
Python stand-in for the kernel that walks the tasks exactly as the warps do.
"""

import numpy as np
import pytest

from ilargi_sklearn._backend import _cuda


def _walk(rows, Z, gather=None, weights=None):
    """What the kernel computes: each task sums its slice of its segment."""
    Z2 = Z.reshape(-1, 1) if Z.ndim == 1 else Z
    out = np.zeros((rows.n_source_rows, Z2.shape[1]))
    seen = np.zeros(rows.perm.shape[0], dtype=int)
    for seg, start in zip(rows.task_seg, rows.task_start, strict=True):
        end = min(int(rows.indptr[seg + 1]), int(start) + _cuda.CHUNK)
        assert rows.indptr[seg] <= start < end
        for e in range(start, end):
            seen[e] += 1
            r = rows.perm[e]
            s = 1.0 if weights is None else weights[r]
            if gather is not None:
                r = gather[r]
                if r < 0:
                    continue
            out[seg] += s * Z2[r]
    # Every matched target row is summed by exactly one warp.
    assert np.all(seen[rows.indptr[0] :] == 1)
    assert np.all(seen[: rows.indptr[0]] == 0)
    return out[:, 0] if Z.ndim == 1 else out


@pytest.mark.parametrize("case", ["random", "one long segment", "empty", "no match"])
def test_segments_cover_each_row_once(case, monkeypatch):
    monkeypatch.setattr(_cuda, "CHUNK", 7)
    rng = np.random.default_rng(0)
    m = 9
    n = {"random": 80, "one long segment": 50, "empty": 0, "no match": 12}[case]
    idx = rng.integers(-1, m, n).astype(np.int32)
    if case == "one long segment":
        idx[:] = 3
    if case == "no match":
        idx[:] = -1
    rows = _cuda.sorted_rows(idx, m, xp=np)
    assert rows.perm.dtype == np.int32
    np.testing.assert_array_equal(
        rows.counts(), np.bincount(idx[idx >= 0], minlength=m)
    )
    Y = rng.standard_normal((n, 3))
    w = rng.random(n)
    want = np.zeros((m, 3))
    np.add.at(want, idx[idx >= 0], (w[:, None] * Y)[idx >= 0])
    np.testing.assert_allclose(_walk(rows, Y, weights=w), want, atol=1e-12)
    # Read through a second index vector: I_a^T I_b Z.
    g = rng.integers(-1, 5, n)
    Zb = rng.standard_normal(5)
    keep = (idx >= 0) & (g >= 0)
    want = np.bincount(idx[keep], weights=Zb[g[keep]], minlength=m)
    np.testing.assert_allclose(_walk(rows, Zb, gather=g), want, atol=1e-12)


def test_kernel_source_names_each_variant():
    src = _cuda.kernel_source("float", "long long", True, False, 4)
    assert "#define T float" in src and "#define I long long" in src
    assert "#define HAS_W 1" in src and "#define HAS_G 0" in src
    assert "#define KC 4" in src and f"#define CHUNK {_cuda.CHUNK}" in src
