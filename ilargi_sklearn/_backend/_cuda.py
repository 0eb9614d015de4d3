"""Segment sums on a CUDA device without atomic contention (CuPy only).

A factorized operator's scatter ``I^T Y`` adds every target row into the row of a
small source table. ``cupy.add.at`` does this with one atomic add per element, and
at a tuple ratio of 1,000 each address of the output takes 1,000 of them in turn.
For a gram's cross term it also needs the ``n x k`` gathered rows first. The
sorted segments here win for cross terms, and for plain scatters only at high tuple
ratios (``RowMap`` picks per ratio; figures from ``benchmarks/gpu_segments.py`` in
``benchmarks/README.md``).

Here the target rows are sorted by their source row once per row map (an argsort,
cached), and one warp sums each source row's segment: every lane adds a
strided part of the segment's rows into registers (up to 8 columns at a time), and
a shuffle reduction writes the sum. A segment longer than :data:`CHUNK` rows is
split into several warps whose partial sums meet in one atomic add each, so a
short source table still fills the device. No output element takes more than
``ceil(len / CHUNK)`` atomic adds; segments of at most :data:`CHUNK` rows are summed
in a fixed order (run-to-run reproducible).

The same kernel also reads its rows through a second index vector: with
``gather`` given, segment ``r`` sums ``w_i Z[gather[i]]`` over the target rows
``i`` of source row ``r``, which is ``I_a^T diag(w) I_b Z`` (a gram's cross term
between two sources) without the ``n x k`` gathered temporary.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["SortedRows", "segment_sum", "sorted_rows"]

#: Most target rows one warp sums before handing a partial sum to an atomic add.
CHUNK = 1024

_THREADS = 256

_SOURCE = r"""
extern "C" __global__ void ilargi_segment_sum(
    const T* __restrict__ Z, const long long ldz, const int k,
    const I* __restrict__ perm, const I* __restrict__ gather,
    const T* __restrict__ w, const long long* __restrict__ indptr,
    const long long* __restrict__ task_seg, const long long* __restrict__ task_start,
    const long long n_tasks, T* __restrict__ out)
{
    const long long task =
        ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (task >= n_tasks) return;  /* whole warps: blockDim is a multiple of 32 */
    const int lane = threadIdx.x & 31;
    const long long seg = task_seg[task];
    const long long start = task_start[task];
    long long end = indptr[seg + 1];
    if (end > start + CHUNK) end = start + CHUNK;
    for (int c0 = 0; c0 < k; c0 += KC) {
        T acc[KC];
#pragma unroll
        for (int c = 0; c < KC; ++c) acc[c] = (T)0;
        for (long long e = start + lane; e < end; e += 32) {
            long long row = (long long)perm[e];
#if HAS_W
            const T s = w[row];
#endif
#if HAS_G
            row = (long long)gather[row];
            if (row < 0) continue;
#endif
            const T* z = Z + row * ldz + c0;
#pragma unroll
            for (int c = 0; c < KC; ++c) {
                if (c0 + c < k) {
#if HAS_W
                    acc[c] += s * z[c];
#else
                    acc[c] += z[c];
#endif
                }
            }
        }
#pragma unroll
        for (int c = 0; c < KC; ++c) {
            T v = acc[c];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                v += __shfl_down_sync(0xffffffffu, v, off);
            if (lane == 0 && c0 + c < k)
                atomicAdd(out + seg * (long long)k + c0 + c, v);
        }
    }
}
"""


def kernel_source(
    value: str, index: str, weighted: bool, gathered: bool, columns: int
) -> str:
    """The CUDA source of one variant (``value``/``index`` are C type names)."""
    head = (
        f"#define T {value}\n#define I {index}\n#define HAS_W {int(weighted)}\n"
        f"#define HAS_G {int(gathered)}\n#define KC {int(columns)}\n"
        f"#define CHUNK {CHUNK}\n"
    )
    return head + _SOURCE


_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_C_INDEX = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


@functools.cache
def _kernel(value: str, index: str, weighted: bool, gathered: bool, columns: int):
    import cupy

    return cupy.RawKernel(
        kernel_source(value, index, weighted, gathered, columns), "ilargi_segment_sum"
    )


class SortedRows:
    """The target rows of one index vector grouped by source row (device arrays).

    Attributes
    ----------
    perm : cupy.ndarray of int
        Target rows with a match, ordered by source row.
    indptr : cupy.ndarray of int64 of shape (n_source_rows + 1,)
        Segment ``r`` is ``perm[indptr[r]:indptr[r + 1]]`` (unmatched rows, the -1
        entries, sort first and lie before ``indptr[0]``).
    task_seg, task_start : cupy.ndarray of int64
        One entry per warp: its segment and first position in ``perm`` (segments
        longer than :data:`CHUNK` are split).
    n_source_rows : int
    """

    __slots__ = ("perm", "indptr", "task_seg", "task_start", "n_source_rows")

    def __init__(self, perm, indptr, task_seg, task_start, n_source_rows):
        self.perm = perm
        self.indptr = indptr
        self.task_seg = task_seg
        self.task_start = task_start
        self.n_source_rows = int(n_source_rows)

    @property
    def n_tasks(self) -> int:
        return int(self.task_seg.shape[0])

    def counts(self) -> Any:
        """Rows per segment, float64 (the unweighted ``I^T 1``)."""
        return (self.indptr[1:] - self.indptr[:-1]).astype(np.float64)


def sorted_rows(idx: Any, n_source_rows: int, xp: Any = None) -> SortedRows:
    """Group the target rows of device index vector ``idx`` by source row.

    One argsort of ``idx`` and one binary search per source row; everything stays
    on the device apart from the number of warps. ``xp`` is CuPy by default (NumPy
    works too, for testing the segmentation on a machine without a GPU).
    """
    if xp is None:
        import cupy as xp

    m = int(n_source_rows)
    order = xp.argsort(idx)
    keys = idx[order]
    indptr = xp.searchsorted(
        keys, xp.arange(m + 1, dtype=keys.dtype), side="left"
    ).astype(np.int64)
    perm = order.astype(idx.dtype, copy=False)
    lengths = indptr[1:] - indptr[:-1]
    pieces = (lengths + (CHUNK - 1)) // CHUNK
    ends = xp.cumsum(pieces)
    n_tasks = int(ends[-1]) if m else 0
    task = xp.arange(n_tasks, dtype=np.int64)
    task_seg = xp.searchsorted(ends, task, side="right").astype(np.int64)
    first = ends[task_seg] - pieces[task_seg]
    task_start = indptr[task_seg] + (task - first) * CHUNK
    return SortedRows(perm, indptr, task_seg, task_start, m)


def segment_sum(
    rows: SortedRows, Z: Any, gather: Any = None, weights: Any = None
) -> Any:
    """Per source row ``r``: the sum of ``w_i Z[g(i)]`` over its target rows ``i``.

    Parameters
    ----------
    rows : SortedRows
    Z : cupy.ndarray of shape (m, k) or (m,)
        Values, read at row ``i`` (no ``gather``: ``m`` is the number of target
        rows) or at row ``gather[i]``.
    gather : cupy.ndarray of int, optional
        Row of ``Z`` for each target row (-1: the row adds nothing).
    weights : cupy.ndarray of shape (n_target_rows,), optional
        Weight of each target row (cast to ``Z``'s dtype).

    Returns
    -------
    cupy.ndarray of shape (n_source_rows, k) or (n_source_rows,), ``Z``'s dtype
    """
    import cupy

    dtype = np.dtype(Z.dtype)
    if dtype not in _C_TYPES:
        raise TypeError(f"segment sums take float32 or float64 values, got {dtype}.")
    vector = Z.ndim == 1
    Z2 = cupy.ascontiguousarray(Z.reshape(-1, 1) if vector else Z)
    k = int(Z2.shape[1])
    out = cupy.zeros((rows.n_source_rows, k), dtype=dtype)
    if k and rows.n_tasks:
        perm = rows.perm
        g = perm if gather is None else gather.astype(perm.dtype, copy=False)
        w = Z2 if weights is None else cupy.ascontiguousarray(weights, dtype=dtype)
        columns = 1 if k == 1 else 2 if k == 2 else 4 if k <= 4 else 8
        kern = _kernel(
            _C_TYPES[dtype],
            _C_INDEX[np.dtype(perm.dtype)],
            weights is not None,
            gather is not None,
            columns,
        )
        blocks = (rows.n_tasks * 32 + _THREADS - 1) // _THREADS
        kern(
            (blocks,),
            (_THREADS,),
            (
                Z2,
                np.int64(k),
                np.int32(k),
                perm,
                g,
                w,
                rows.indptr,
                rows.task_seg,
                rows.task_start,
                np.int64(rows.n_tasks),
                out,
            ),
        )
    return out[:, 0] if vector else out
