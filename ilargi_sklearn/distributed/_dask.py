"""The operator protocol over Dask arrays: a fact table spread over a cluster.

The base table and the index vectors are Dask arrays chunked by target rows (one
chunk along the columns); the dimension sources are small dense NumPy arrays,
kept once on the cluster as single-chunk arrays that every row chunk reads (a
broadcast). Every product or reduction pairs each fact-table chunk with the matching
chunks of the index vectors through :func:`dask.array.blockwise` with explicit index
labels (``map_blocks`` would broadcast a 1-D index chunk against the last axis and
pair the wrong blocks), and is either

* row-local (``T @ X``, the row statistics): the result is an n-length Dask array,
  chunked like the fact table, that stays on the cluster; or
* a reduction (``T.T @ Y``, the gram, the column statistics): one fused task per row
  chunk computes every partial of that chunk at once (``B^T Y`` and the chunk's rows
  summed into the source rows of each dimension, which are source-sized; for the
  gram, the chunk's whole ``(n_cols, n_cols)`` gram with the broadcast sources),
  Dask sums the partials in a tree, and one final task multiplies the sums by the
  dimension sources and places the blocks; only that parameter-sized result
  reaches the client. One graph, one submission per operator call.

On a ``distributed`` cluster the row chunks of the base table, of every index
vector and of every n-length operand that the operator uploads (targets, sample
weights) are pinned to the same worker (:meth:`DaskFactorizedMatrix.persist`,
:meth:`DaskFactorizedMatrix.align_rows`), so that an iteration moves no row data
between workers.

Dask is imported by this module only (the ``[dask]`` extra).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend._namespace import is_numpy_namespace
from ilargi_sklearn._backend._ops import segment_sum
from ilargi_sklearn.distributed._namespace import DaskNamespace
from ilargi_sklearn.multisource._operators import (
    FactorizedMatrix,
    MatrixOperator,
    Operator,
    Term,
)

__all__ = ["DaskFactorizedMatrix", "dask_dataset"]

logger = logging.getLogger(__name__)

_ROW = "row"


# ----------------------------------------------------------------- chunk kernels
def _pad_take(Z: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``I @ Z`` for one chunk: rows of ``Z`` by ``idx``, zeros where ``idx`` is -1."""
    if idx.size and int(idx.min()) < 0:
        Z = np.concatenate([Z, np.zeros((1,) + Z.shape[1:], dtype=Z.dtype)])
    return np.take(Z, idx, axis=0)


def _rows_chunk(*arrays: Any, has_base: bool, XB: Any, square: bool, dtype: Any):
    """``B X_B + sum_k I_k Z_k`` on one row chunk (``Z_k`` precomputed, small)."""
    out = None
    pos = 0
    if has_base:
        B = arrays[0]
        out = (B * B if square else B) @ XB
        pos = 1
    for idx, Z in zip(arrays[pos::2], arrays[pos + 1 :: 2]):
        g = _pad_take(Z, idx)
        out = g if out is None else out + g
    return out.astype(dtype, copy=False)


def _flat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The partials of one chunk as one row ``(1, L)`` (summed across chunks)."""
    return np.concatenate([np.ravel(p).astype(dtype, copy=False) for p in parts])[None]


def _rmatmul_chunk(*arrays: Any, has_base: bool, sizes: tuple[int, ...], dtype: Any):
    """``[B^T Y, I_1^T Y, ..., I_K^T Y]`` of one chunk, flattened.

    ``arrays`` is ``[B], idx_1, ..., idx_K, Y``.
    """
    Y = arrays[-1]
    Y2 = Y.reshape(Y.shape[0], -1)
    parts = []
    pos = 0
    if has_base:
        parts.append(arrays[0].T @ Y2)
        pos = 1
    for idx, r in zip(arrays[pos:-1], sizes):
        parts.append(segment_sum(Y2, idx, r))
    return _flat(parts, dtype)


def _col_chunk(
    *arrays: Any,
    has_base: bool,
    sizes: tuple[int, ...],
    square: bool,
    weighted: bool,
    dtype: Any,
):
    """``[w^T B (or w^T (B o B)), I_1^T w, ..., I_K^T w]`` of one chunk, flattened.

    ``arrays`` is ``[B], idx_1, ..., idx_K, [w]``.
    """
    w = arrays[-1] if weighted else None
    body = arrays[:-1] if weighted else arrays
    n = body[0].shape[0]
    parts = []
    pos = 0
    if has_base:
        B = body[0]
        B = B * B if square else B
        parts.append(B.sum(axis=0) if w is None else w @ B)
        pos = 1
    v = np.ones(n, dtype=dtype) if w is None else w
    for idx, r in zip(body[pos:], sizes):
        parts.append(segment_sum(v, idx, r))
    return _flat(parts, dtype)


def _gram_chunk(
    *arrays: Any,
    has_base: bool,
    n_dims: int,
    pairs: tuple[tuple[int, int], ...],
    base_cols: np.ndarray | None,
    dim_cols: Sequence[np.ndarray],
    n_cols: int,
    weighted: bool,
    dtype: Any,
):
    """The gram of one chunk, ``T_c^T W_c T_c``, flattened (summed across chunks).

    ``arrays`` is ``[B], idx_1, ..., idx_K, S_1, ..., S_K, [w]``. Blocks:
    ``B^T W B``; ``S_a^T diag(I_a^T w) S_a``; ``S_a^T (I_a^T W B)``; and for each
    pair ``(a, b)`` (``a`` the smaller source) ``S_a^T (I_a^T W I_b S_b)`` from the
    chunk's co-occurrence counts. The sources' products run here, so every partial
    is ``(n_cols, n_cols)`` and no source-sized array travels.
    """
    w = arrays[-1] if weighted else None
    pos = 1 if has_base else 0
    B = arrays[0] if has_base else None
    indices = arrays[pos : pos + n_dims]
    dims = arrays[pos + n_dims : pos + 2 * n_dims]
    n = indices[0].shape[0] if n_dims else B.shape[0]
    G = np.zeros((n_cols, n_cols), dtype=dtype)
    if has_base:
        G[np.ix_(base_cols, base_cols)] = (B if w is None else B * w[:, None]).T @ B
    v = np.ones(n, dtype=dtype) if w is None else w
    for a in range(n_dims):
        S, ca, r = dims[a], dim_cols[a], dims[a].shape[0]
        cnt = segment_sum(v, indices[a], r)
        G[np.ix_(ca, ca)] += (S * cnt[:, None]).T @ S
        if has_base:
            block = S.T @ segment_sum(B, indices[a], r, weights=w)
            G[np.ix_(ca, base_cols)] += block
            G[np.ix_(base_cols, ca)] += block.T
    for a, b in pairs:
        cross = _cross_partial(indices[a], indices[b], dims[b], w, dims[a].shape[0])
        block = dims[a].T @ cross
        G[np.ix_(dim_cols[a], dim_cols[b])] += block
        G[np.ix_(dim_cols[b], dim_cols[a])] += block.T
    return G.reshape(1, -1)


def _cross_partial(idx_a, idx_b, S_b, w, n_a):
    """``I_a^T diag(w) I_b S_b`` of one chunk through the co-occurrence counts.

    The sparse ``(r_a, r_b)`` counts have at most one entry per row of the chunk,
    so the product never builds the chunk's ``(n_chunk, c_b)`` gather.
    """
    keep = (idx_a >= 0) & (idx_b >= 0)
    data = np.ones(int(keep.sum()), dtype=S_b.dtype) if w is None else w[keep]
    C = sp.csr_matrix((data, (idx_a[keep], idx_b[keep])), shape=(n_a, S_b.shape[0]))
    return np.asarray(C @ S_b)


def _unflatten(total: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[Any]:
    out, pos = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(total[pos : pos + size].reshape(shape))
        pos += size
    return out


def _rmatmul_finish(total, *dims, shapes, base_cols, dim_cols, n_cols, tail, dtype):
    """``T^T Y`` from the summed partials (runs once, on the cluster)."""
    parts = _unflatten(total, shapes)
    out = np.zeros((n_cols, int(np.prod(tail, dtype=np.int64))), dtype=dtype)
    if base_cols is not None:
        out[base_cols] += parts.pop(0)
    for S, R, cols in zip(dims, parts, dim_cols):
        out[cols] += S.T @ R
    return out.reshape((n_cols,) + tuple(tail))


def _col_finish(total, *dims, shapes, base_cols, dim_cols, n_cols, square, dtype):
    parts = _unflatten(total, shapes)
    out = np.zeros(n_cols, dtype=dtype)
    if base_cols is not None:
        out[base_cols] += parts.pop(0)
    for S, cnt, cols in zip(dims, parts, dim_cols):
        out[cols] += (S * S if square else S).T @ cnt
    return out


def _reshape_finish(total, *dims, shape):
    """The summed flat partials in their final shape."""
    return total.reshape(shape)


def _materialize_chunk(*arrays: Any, has_base: bool, layout: Any, m: int, dtype: Any):
    """The joined rows of one chunk, ``(n_chunk, m)`` dense."""
    n_chunk = arrays[0].shape[0]
    out = np.zeros((n_chunk, m), dtype=dtype)
    pos = 0
    if has_base:
        out[:, layout[0]] = arrays[0]
        pos = 1
    for k, (idx, S) in enumerate(zip(arrays[pos::2], arrays[pos + 1 :: 2])):
        out[:, layout[1 + k] if has_base else layout[k]] = _pad_take(S, idx)
    return out


# --------------------------------------------------------------- chunk placement
def _client() -> Any:
    """The current ``distributed`` client, or None (local schedulers)."""
    try:
        from distributed import default_client
    except ImportError:  # pragma: no cover - the [dask] extra brings distributed
        return None
    try:
        return default_client()
    except ValueError:
        return None


def _placement(client: Any, A: Any) -> list[str]:
    """The worker that holds each row chunk of the persisted array ``A``."""
    from distributed import wait

    wait(A)
    keys = [k for k in dask.core.flatten(A.__dask_keys__())]
    who = client.who_has(A)
    return [sorted(who[k])[0] for k in keys]


def _pin(client: Any, chunks: list[Any], placement: list[str], persist: bool):
    """Row chunks (Dask or NumPy) held on the workers in ``placement``.

    Chunks are grouped by worker so that each worker costs one call.
    """
    out: list[Any] = [None] * len(chunks)
    for worker in sorted(set(placement)):
        ids = [i for i, w in enumerate(placement) if w == worker]
        if persist:
            held = client.persist([chunks[i] for i in ids], workers=[worker])
        else:
            held = client.scatter(
                [chunks[i] for i in ids], workers=[worker], hash=False
            )
        for i, h in zip(ids, held):
            out[i] = h
    return out


def _pinned_array(
    client: Any, A: Any, row_chunks: tuple[int, ...], placement: list[str]
) -> Any:
    """``A`` (NumPy or Dask, n-length) persisted with its chunks on ``placement``."""
    if isinstance(A, da.Array):
        A = A.rechunk((row_chunks,) + tuple(-1 for _ in A.shape[1:]))
        pieces = _pin(
            client, [A.blocks[i] for i in range(len(row_chunks))], placement, True
        )
    else:
        A = np.asarray(A)
        bounds = np.cumsum((0,) + tuple(row_chunks))
        chunks = [A[bounds[i] : bounds[i + 1]] for i in range(len(row_chunks))]
        futures = _pin(client, chunks, placement, False)
        pieces = [
            da.from_delayed(f, shape=c.shape, dtype=A.dtype, meta=A[:0])
            for f, c in zip(futures, chunks)
        ]
    # The concatenation's tasks are aliases: each runs where its chunk is held.
    return da.concatenate(pieces, axis=0).persist()


# ------------------------------------------------------------------- the operator
def _row_ind(ndim: int) -> tuple[str, ...]:
    return (_ROW,) if ndim == 1 else (_ROW, "k")


def _as_host(X: Any) -> np.ndarray:
    """A parameter-sized operand (NumPy, Dask or other) as a NumPy array."""
    if isinstance(X, da.Array):
        return np.asarray(X.compute())
    if isinstance(X, np.ndarray):
        return X
    from ilargi_sklearn._backend._namespace import to_numpy

    return np.asarray(to_numpy(X))


class DaskFactorizedMatrix(Operator):
    """``T = B M_B^T + sum_k I_k S_k M_k^T`` with ``B`` and the ``I_k`` on a cluster.

    Parameters
    ----------
    base : dask.array.Array of shape (n_rows, p) or None
        The base (fact) table, chunked by rows (rechunked to one chunk along the
        columns). None when every source is a dimension.
    base_cols : ndarray of int of shape (p,) or None
        Target column of each base column.
    dims : list of ndarray
        Dense dimension sources ``S_k`` of shape ``(r_k, c_k)``.
    indices : list of dask.array.Array
        Index vector of each dimension (length ``n_rows``, source row of each target
        row, -1 for no match), rechunked to the base's row chunks.
    dim_cols : list of ndarray of int
        Target column of each column of ``S_k``.
    n_cols : int
        Number of target columns.
    dtype : dtype
        Floating dtype of every source and result.
    dims_on_cluster : list of dask.array.Array, optional
        Single-chunk (persisted) copies of the dimension sources; built from
        ``dims`` when None.
    placement : list of str, optional
        Worker address holding each row chunk (set by :meth:`persist` on a
        ``distributed`` cluster); n-length operands are pinned to the same workers.

    Notes
    -----
    Every target column is owned by exactly one source (no overlapping columns).
    ``matmul``, ``row_sq_norms`` and ``row_sums`` return lazy n-length Dask arrays;
    ``rmatmul``, ``gram`` and the column statistics return NumPy arrays computed by
    one graph each (one fused task per row chunk, a tree sum, one final task).
    The operator's namespace (:attr:`xp`) is a :class:`DaskNamespace`: kernels
    written against the array API keep n-length arrays on the cluster and get
    parameter-sized results as NumPy arrays.
    """

    def __init__(
        self,
        base: Any,
        base_cols: np.ndarray | None,
        dims: Sequence[np.ndarray],
        indices: Sequence[Any],
        dim_cols: Sequence[np.ndarray],
        n_cols: int,
        dtype: Any,
        dims_on_cluster: Sequence[Any] | None = None,
        placement: Sequence[str] | None = None,
    ) -> None:
        self.dtype = np.dtype(dtype)
        if base is None and not dims:
            raise ValueError(
                "a DaskFactorizedMatrix needs a base table or a dimension."
            )
        if len(dims) != len(indices) or len(dims) != len(dim_cols):
            raise ValueError(
                f"got {len(dims)} dimension sources, {len(indices)} index vectors and "
                f"{len(dim_cols)} column maps; they must agree."
            )
        if base is not None:
            if base.ndim != 2:
                raise ValueError(f"the base must be 2-D, got shape {base.shape}.")
            if len(base.chunks[1]) > 1:
                base = base.rechunk({1: -1})
            row_chunks = base.chunks[0]
        else:
            row_chunks = indices[0].chunks[0]
        self.base = base
        self.base_cols = None if base is None else np.asarray(base_cols, dtype=np.int64)
        self.dims = [np.asarray(S) for S in dims]
        self.indices = [
            idx if idx.chunks[0] == row_chunks else idx.rechunk((row_chunks,))
            for idx in indices
        ]
        self.dim_cols = [np.asarray(c, dtype=np.int64) for c in dim_cols]
        if dims_on_cluster is None:
            dims_on_cluster = [da.from_array(S, chunks=S.shape) for S in self.dims]
        self.dims_on_cluster = list(dims_on_cluster)
        n_rows = int(base.shape[0]) if base is not None else int(indices[0].shape[0])
        self.row_chunks = tuple(int(c) for c in row_chunks)
        self.placement = None if placement is None else list(placement)
        self.shape = (n_rows, int(n_cols))
        self._xp = DaskNamespace(self.row_chunks, self.align_rows)

    # ------------------------------------------------------------ properties
    @property
    def xp(self) -> DaskNamespace:
        """The namespace of the kernels: Dask for row arrays, NumPy for the rest."""
        return self._xp

    @property
    def device(self) -> Any:
        return "cpu"

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def n_chunks(self) -> int:
        """Number of row chunks."""
        return len(self.row_chunks)

    @property
    def nbytes(self) -> int:
        total = 0 if self.base is None else int(self.base.nbytes)
        total += sum(int(idx.nbytes) for idx in self.indices)
        total += sum(int(S.nbytes) for S in self.dims)
        return total

    def _dim_ind(self, k: int) -> tuple[str, str]:
        return (f"s{k}r", f"s{k}c")

    def _row_args(self) -> list[Any]:
        """The base and the index vectors as blockwise arguments."""
        args: list[Any] = []
        if self.base is not None:
            args += [self.base, (_ROW, "bc")]
        for idx in self.indices:
            args += [idx, (_ROW,)]
        return args

    def _dim_args(self) -> list[Any]:
        args: list[Any] = []
        for k, Sd in enumerate(self.dims_on_cluster):
            args += [Sd, self._dim_ind(k)]
        return args

    # -------------------------------------------------------- operands on rows
    def align_rows(self, Y: Any) -> Any:
        """An n-length array as a persisted Dask array laid out like the rows.

        Chunked like the fact table and, on a ``distributed`` cluster where the
        operator was persisted, every chunk held by the worker that holds the
        matching fact-table chunk: an iteration that combines them moves no rows.

        Parameters
        ----------
        Y : {ndarray, dask.array.Array} of shape (n_rows,) or (n_rows, k)

        Returns
        -------
        dask.array.Array
            Persisted; a NumPy input is uploaded once.
        """
        if Y.shape[:1] != (self.n_rows,):
            raise ValueError(f"got shape {Y.shape}; expected ({self.n_rows}, ...).")
        client = _client()
        if client is not None and self.placement is not None:
            return _pinned_array(client, Y, self.row_chunks, self.placement)
        if isinstance(Y, da.Array):
            Y = Y.rechunk((self.row_chunks,) + tuple(-1 for _ in Y.shape[1:]))
            return Y.persist()
        Y = np.asarray(Y)
        return da.from_array(Y, chunks=(self.row_chunks,) + Y.shape[1:]).persist()

    def _rows_operand(self, Y: Any, name: str) -> Any:
        """An n-length operand as a Dask array chunked like the fact table."""
        if not isinstance(Y, da.Array):
            Y = np.asarray(_as_host(Y))
            if Y.shape[:1] != (self.n_rows,):
                raise ValueError(
                    f"{name} has shape {Y.shape}; expected ({self.n_rows}, ...)."
                )
            return self.align_rows(Y)
        if Y.shape[0] != self.n_rows:
            raise ValueError(
                f"{name} has shape {Y.shape}; expected ({self.n_rows}, ...)."
            )
        if Y.chunks[0] != self.row_chunks or any(len(c) > 1 for c in Y.chunks[1:]):
            Y = Y.rechunk((self.row_chunks,) + tuple(-1 for _ in Y.shape[1:]))
        return Y

    def hold(self, A: Any) -> Any:
        """Evaluate an intermediate that a loop carries to its next iteration.

        A lazy n-length Dask array is persisted on the cluster (so the next
        iteration reads it instead of recomputing its whole history); a
        parameter-sized one is computed to NumPy; anything else is returned as is.
        """
        if not isinstance(A, da.Array):
            return A
        return self._xp._settle(A, persist=True)

    # -------------------------------------------------------------- row-local
    def _rows(self, X: np.ndarray, square: bool) -> Any:
        """``T @ X`` (``square``: ``(T * T) @ X``), a lazy n-length Dask array."""
        X = _as_host(X)
        dtype = np.result_type(self.dtype, X.dtype)
        out_ind = _row_ind(X.ndim)
        tail = out_ind[1:]
        args: list[Any] = []
        XB = None
        if self.base is not None:
            args += [self.base, (_ROW, "bc")]
            XB = X[self.base_cols]
        for k, (S, idx, cols) in enumerate(
            zip(self.dims_on_cluster, self.indices, self.dim_cols)
        ):
            Z = (S * S if square else S) @ X[cols]
            args += [idx, (_ROW,), Z, (f"s{k}r", *tail)]
        shape = (self.n_rows,) + X.shape[1:]
        return da.blockwise(
            functools.partial(
                _rows_chunk,
                has_base=self.base is not None,
                XB=XB,
                square=square,
                dtype=dtype,
            ),
            out_ind,
            *args,
            concatenate=True,
            dtype=dtype,
            meta=np.empty((0,) * len(shape), dtype=dtype),
        )

    def matmul(self, X: Any) -> Any:
        """``T @ X``: a lazy Dask array of shape ``(n_rows,)`` or ``(n_rows, k)``."""
        X = _as_host(X)
        if X.ndim not in (1, 2) or X.shape[0] != self.n_cols:
            raise ValueError(
                f"right operand has shape {X.shape}; expected ({self.n_cols},) or "
                f"({self.n_cols}, k)."
            )
        return self._rows(X, square=False)

    def row_sq_norms(self, col_weights: Any = None) -> Any:
        """``(T * T) @ col_weights`` (squared row norms when None), lazy."""
        c = (
            np.ones(self.n_cols, dtype=self.dtype)
            if col_weights is None
            else _as_host(col_weights)
        )
        return self._rows(c, square=True)

    def row_sums(self) -> Any:
        return self._rows(np.ones(self.n_cols, dtype=self.dtype), square=False)

    # -------------------------------------------------------------- reductions
    def _reduce(
        self,
        chunk: Any,
        row_args: list[Any],
        length: int,
        finish: Any,
        out_shape: tuple[int, ...],
        dtype: Any,
    ) -> np.ndarray:
        """``finish(sum over chunks of chunk(...), *dims)``, computed once.

        ``chunk`` returns a ``(1, length)`` row of flattened partials per row chunk;
        the rows are summed in a tree and ``finish`` (one task) turns the sum into
        the ``out_shape`` result with the dimension sources on the cluster.
        """
        parts = da.blockwise(
            chunk,
            (_ROW, "flat"),
            *row_args,
            new_axes={"flat": int(length)},
            adjust_chunks={_ROW: 1},
            concatenate=True,
            dtype=dtype,
            meta=np.empty((0, 0), dtype=dtype),
        )
        total = parts.sum(axis=0)
        out_ind = tuple(f"out{i}" for i in range(len(out_shape)))
        result = da.blockwise(
            finish,
            out_ind,
            total,
            ("flat",),
            *self._dim_args(),
            new_axes=dict(zip(out_ind, (int(s) for s in out_shape))),
            concatenate=True,
            dtype=dtype,
            meta=np.empty((0,) * len(out_shape), dtype=dtype),
        )
        return np.asarray(result.compute())

    def rmatmul(self, Y: Any) -> np.ndarray:
        """``T.T @ Y`` as a NumPy array (partials per chunk, summed on the cluster)."""
        Y = self._rows_operand(Y, "left operand")
        dtype = np.result_type(self.dtype, Y.dtype)
        tail = tuple(int(s) for s in Y.shape[1:])
        k = int(np.prod(tail, dtype=np.int64))
        sizes = tuple(int(S.shape[0]) for S in self.dims)
        shapes = [(r, k) for r in sizes]
        if self.base is not None:
            shapes.insert(0, (self.base.shape[1], k))
        chunk = functools.partial(
            _rmatmul_chunk, has_base=self.base is not None, sizes=sizes, dtype=dtype
        )
        finish = functools.partial(
            _rmatmul_finish,
            shapes=shapes,
            base_cols=self.base_cols,
            dim_cols=self.dim_cols,
            n_cols=self.n_cols,
            tail=tail,
            dtype=dtype,
        )
        length = sum(int(np.prod(s)) for s in shapes)
        args = self._row_args() + [Y, _row_ind(Y.ndim)]
        return self._reduce(chunk, args, length, finish, (self.n_cols,) + tail, dtype)

    def _weights(self, weights: Any) -> list[Any]:
        if weights is None:
            return []
        w = self._rows_operand(weights, "weights")
        if w.ndim != 1:
            raise ValueError(f"weights must be 1-D, got shape {w.shape}.")
        return [w, (_ROW,)]

    def _col_reduce(self, weights: Any, square: bool) -> np.ndarray:
        w = self._weights(weights)
        sizes = tuple(int(S.shape[0]) for S in self.dims)
        shapes = [(r,) for r in sizes]
        if self.base is not None:
            shapes.insert(0, (self.base.shape[1],))
        dt = self.dtype
        chunk = functools.partial(
            _col_chunk,
            has_base=self.base is not None,
            sizes=sizes,
            square=square,
            weighted=bool(w),
            dtype=dt,
        )
        finish = functools.partial(
            _col_finish,
            shapes=shapes,
            base_cols=self.base_cols,
            dim_cols=self.dim_cols,
            n_cols=self.n_cols,
            square=square,
            dtype=dt,
        )
        length = sum(int(np.prod(s)) for s in shapes)
        args = self._row_args() + w
        return self._reduce(chunk, args, length, finish, (self.n_cols,), dt)

    def col_sums(self, weights: Any = None) -> np.ndarray:
        """``weights @ T`` (column sums when None) as a NumPy array."""
        return self._col_reduce(weights, square=False)

    def col_sq_sums(self, weights: Any = None) -> np.ndarray:
        """``weights @ (T * T)`` as a NumPy array."""
        return self._col_reduce(weights, square=True)

    def gram(self, weights: Any = None, format: str = "auto") -> np.ndarray:
        """``T.T @ diag(weights) @ T`` as a dense NumPy array.

        Each row chunk computes its whole gram ``T_c^T W_c T_c`` in one task, with
        the (broadcast) dimension sources: ``B^T W B``, ``S_k^T diag(I_k^T w) S_k``,
        ``S_k^T I_k^T W B`` and ``S_a^T C_ab S_b`` from the chunk's co-occurrence
        counts ``C_ab = I_a^T W I_b``; the ``(n_cols, n_cols)`` partials are summed
        in a tree. One graph; nothing source-sized or row-sized travels.
        """
        if format not in ("auto", "dense", "sparse"):
            raise ValueError(
                f"format must be 'auto', 'dense' or 'sparse', got {format!r}."
            )
        if format == "sparse":
            raise TypeError(
                "a DaskFactorizedMatrix has dense sources; ask for format='dense'."
            )
        w = self._weights(weights)
        dt = self.dtype
        K = len(self.dims)
        sizes = tuple(int(S.shape[0]) for S in self.dims)
        # Scatter each cross block into the rows of the smaller source.
        pairs = tuple(
            (a, b) if sizes[a] <= sizes[b] else (b, a)
            for a in range(K)
            for b in range(a + 1, K)
        )
        chunk = functools.partial(
            _gram_chunk,
            has_base=self.base is not None,
            n_dims=K,
            pairs=pairs,
            base_cols=self.base_cols,
            dim_cols=self.dim_cols,
            n_cols=self.n_cols,
            weighted=bool(w),
            dtype=dt,
        )
        shape = (self.n_cols, self.n_cols)
        finish = functools.partial(_reshape_finish, shape=shape)
        args = self._row_args() + self._dim_args() + w
        return self._reduce(chunk, args, self.n_cols**2, finish, shape, dt)

    # ---------------------------------------------------------- rows and copies
    def take_rows(self, rows: Any) -> DaskFactorizedMatrix:
        """The row subset ``T[rows]`` (NumPy or Dask integer positions), lazy."""
        if not isinstance(rows, da.Array):
            rows = np.asarray(rows)
            if rows.dtype == bool:
                rows = np.flatnonzero(rows)
        base = None if self.base is None else self.base[rows]
        indices = [idx[rows] for idx in self.indices]
        if base is not None:
            base = base.rechunk({0: "auto", 1: -1})
        return DaskFactorizedMatrix(
            base,
            self.base_cols,
            self.dims,
            indices,
            self.dim_cols,
            self.n_cols,
            self.dtype,
            dims_on_cluster=self.dims_on_cluster,
        )

    def persist(self) -> DaskFactorizedMatrix:
        """The same operator with base, index vectors and sources held in memory.

        On a ``distributed`` cluster the base (or the first index vector) is
        persisted first; every other row array is then pinned, chunk by chunk, to
        the worker that holds the matching base chunk, and the placement is kept
        for the n-length operands uploaded later (:meth:`align_rows`).
        """
        client = _client()
        placement = None
        if client is None:
            base, indices, dims = dask.persist(
                self.base, self.indices, self.dims_on_cluster
            )
            indices = list(indices)
        else:
            anchor = self.base if self.base is not None else self.indices[0]
            anchor = client.persist(anchor)
            placement = _placement(client, anchor)
            # All sources on one worker: the tasks that read them (the products
            # ``S_k X`` and the final reduction step) run there and fetch nothing.
            dims = client.persist(self.dims_on_cluster, workers=[placement[0]])
            rest = self.indices if self.base is not None else self.indices[1:]
            pinned = [
                _pinned_array(client, idx, self.row_chunks, placement) for idx in rest
            ]
            if self.base is not None:
                base, indices = anchor, pinned
            else:
                base, indices = None, [anchor, *pinned]
            logger.info(
                "Dask operator persisted: %d row chunks on %d workers",
                self.n_chunks,
                len(set(placement)),
            )
        return DaskFactorizedMatrix(
            base,
            self.base_cols,
            self.dims,
            indices,
            self.dim_cols,
            self.n_cols,
            self.dtype,
            dims_on_cluster=list(dims),
            placement=placement,
        )

    def astype(self, dtype: Any) -> DaskFactorizedMatrix:
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        return DaskFactorizedMatrix(
            None if self.base is None else self.base.astype(dtype),
            self.base_cols,
            [S.astype(dtype) for S in self.dims],
            self.indices,
            self.dim_cols,
            self.n_cols,
            dtype,
            placement=self.placement,
        )

    def materialize(self, format: str = "auto") -> Any:
        """``T`` as a lazy dense Dask array chunked by rows (never sparse)."""
        if format == "sparse":
            raise TypeError(
                "a DaskFactorizedMatrix materializes as a dense Dask array; "
                "ask for format='dense'."
            )
        if format not in ("auto", "dense"):
            raise ValueError(
                f"format must be 'auto', 'dense' or 'sparse', got {format!r}."
            )
        args: list[Any] = []
        layout = []
        if self.base is not None:
            args += [self.base, (_ROW, "bc")]
            layout.append(self.base_cols)
        for k, (Sd, idx, cols) in enumerate(
            zip(self.dims_on_cluster, self.indices, self.dim_cols)
        ):
            args += [idx, (_ROW,), Sd, self._dim_ind(k)]
            layout.append(cols)
        m = self.n_cols
        return da.blockwise(
            functools.partial(
                _materialize_chunk,
                has_base=self.base is not None,
                layout=layout,
                m=m,
                dtype=self.dtype,
            ),
            (_ROW, "col"),
            *args,
            new_axes={"col": m},
            concatenate=True,
            dtype=self.dtype,
            meta=np.empty((0, 0), dtype=self.dtype),
        )

    def materialized(self) -> MatrixOperator:
        """Not supported: a materialized plan on a Dask-backed dataset.

        Its fitted attributes would come back as Dask arrays, and the joined
        matrix is what the cluster is there to avoid; ``materialize()`` builds the
        lazy joined array for those who want it.
        """
        raise NotImplementedError(
            "strategy='materialized' is not supported on a Dask-backed dataset: "
            "fit with strategy='factorized' (the default), or build the joined "
            "Dask array yourself with ds.materialize()."
        )

    def to_in_memory(self) -> FactorizedMatrix:
        """The same normalized matrix as an in-memory :class:`FactorizedMatrix`.

        Computes the base table and the index vectors to the client.
        """
        from ilargi_sklearn._backend import RowMap

        base, indices = dask.compute(self.base, self.indices)
        terms = []
        k0 = 0
        if base is not None:
            terms.append(
                Term(np.asarray(base), RowMap(None, base.shape[0]), self.base_cols, 0)
            )
            k0 = 1
        for k, (S, idx, cols) in enumerate(zip(self.dims, indices, self.dim_cols)):
            terms.append(Term(S, RowMap(np.asarray(idx), S.shape[0]), cols, k0 + k))
        return FactorizedMatrix(terms, self.n_rows, self.n_cols, self.dtype)

    def to_namespace(self, xp: Any, device: Any = None) -> Operator:
        if is_numpy_namespace(xp):
            return self.to_in_memory()
        if getattr(xp, "__name__", "") in ("dask.array", "array_api_compat.dask.array"):
            return self
        raise TypeError(
            f"a DaskFactorizedMatrix cannot move to the namespace {xp.__name__}."
        )

    def __repr__(self) -> str:
        return (
            f"DaskFactorizedMatrix({self.n_rows:,} x {self.n_cols}, "
            f"{self.n_chunks} row chunks, {len(self.dims)} dimensions, {self.dtype})"
        )


# ------------------------------------------------------------------- the builder
def dask_dataset(
    sources: Sequence[Any],
    indicators: Sequence[Any],
    feature_names: Sequence[str] | None = None,
    *,
    source_names: Sequence[str] | None = None,
    dtype: Any = np.float64,
    chunks: int | str = "auto",
    persist: bool = True,
) -> Any:
    """A :class:`~ilargi_sklearn.MultiSourceDataset` over a Dask-backed operator.

    Mirrors :meth:`MultiSourceDataset.from_matrices` with the default column
    mapping (the sources' columns concatenated in order).

    Parameters
    ----------
    sources : list of {dask.array.Array, ndarray}
        The base source (indicator None; Dask or NumPy, chunked by rows) and the
        dense dimension sources (NumPy, or small Dask arrays computed once).
    indicators : list of {dask.array.Array, ndarray of int, None}
        None for the base, else the index vector of the source (length
        ``n_rows``, -1 for no match).
    feature_names : list of str, optional
        Default ``"{source}__{j}"``.
    source_names : list of str, optional
        Default ``"s0", "s1", ...``.
    dtype : {np.float64, np.float32}, default=np.float64
    chunks : int or "auto", default="auto"
        Rows per chunk for NumPy base or index inputs.
    persist : bool, default=True
        Hold base, index vectors and sources in cluster memory
        (``dask.persist``), so that every iteration reads them from there.

    Returns
    -------
    MultiSourceDataset
        Its ``operator`` is a :class:`DaskFactorizedMatrix`.

    Raises
    ------
    ValueError
        On more than one base, mismatched lengths, non-integer index vectors, index
        values outside ``[-1, r_k)`` or non-finite values (checked in one pass on
        the cluster).

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> base = da.from_array(np.array([[1.0], [2.0], [3.0]]), chunks=2)
    >>> dim = np.array([[10.0, 0.0], [20.0, 1.0]])
    >>> ds = dask_dataset([base, dim], [None, np.array([0, 1, -1])])
    >>> (ds @ np.ones(3)).compute()
    array([11., 23.,  3.])
    >>> ds.gram()[0]
    array([14., 50.,  2.])
    """
    from ilargi_sklearn.multisource import MultiSourceDataset
    from ilargi_sklearn.multisource._matrices import (
        _check_dtype,
        _check_source_names,
    )

    dtype = _check_dtype(dtype)
    names = _check_source_names(sources, indicators, source_names)
    n_sources = len(names)
    bases = [k for k, ind in enumerate(indicators) if ind is None]
    if len(bases) > 1:
        raise ValueError(
            f"at most one source can be the base (indicator None); got sources "
            f"{[names[k] for k in bases]}."
        )
    base_k = bases[0] if bases else None

    # Column layout: sources concatenated in order.
    cols, offset = [], 0
    for S in sources:
        if len(S.shape) != 2:
            raise ValueError(f"sources must be 2-D, got shape {S.shape}.")
        cols.append(np.arange(offset, offset + int(S.shape[1])))
        offset += int(S.shape[1])
    n_cols = offset

    base = None
    row_chunks: Any = chunks
    if base_k is not None:
        B = sources[base_k]
        base = (
            B
            if isinstance(B, da.Array)
            else da.from_array(np.asarray(B), chunks=(chunks, -1))
        )
        if base.dtype.kind not in "biuf":
            raise ValueError(f"source {names[base_k]!r} is not numeric: {base.dtype}.")
        base = base.astype(dtype).rechunk({1: -1})
        row_chunks = base.chunks[0]
    dims, indices, dim_cols, dim_names = [], [], [], []
    for k, (S, ind) in enumerate(zip(sources, indicators)):
        if k == base_k:
            continue
        S = np.asarray(S.compute() if isinstance(S, da.Array) else S)
        if S.dtype.kind not in "biuf":
            raise ValueError(f"source {names[k]!r} is not numeric: {S.dtype}.")
        S = S.astype(dtype)
        bad = ~np.isfinite(S)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise ValueError(
                f"source {names[k]!r} has a non-finite value {S[r, c]} in row {r}, "
                f"column {c}."
            )
        if not isinstance(ind, da.Array):
            ind = np.asarray(ind)
            if ind.ndim != 1:
                raise ValueError(
                    f"indicator of source {names[k]!r} must be a 1-D index vector, "
                    f"got shape {ind.shape}."
                )
            if base is not None and ind.shape[0] != base.shape[0]:
                raise ValueError(
                    f"base and index vectors disagree on the number of target rows: "
                    f"index vector of source {names[k]!r} has {ind.shape[0]}, the "
                    f"base {base.shape[0]}."
                )
            ind = da.from_array(ind, chunks=row_chunks if base is not None else chunks)
        if ind.dtype.kind not in "iu":
            raise ValueError(
                f"index vector of source {names[k]!r} must be integers, got {ind.dtype}."
            )
        ind = ind.astype(np.int64)
        if base is None and not indices:
            row_chunks = ind.chunks[0]
        dims.append(S)
        indices.append(ind)
        dim_cols.append(cols[k])
        dim_names.append(names[k])
    lengths = {int(a.shape[0]) for a in ([base] if base is not None else []) + indices}
    if len(lengths) != 1:
        raise ValueError(
            f"base and index vectors disagree on the number of target rows: "
            f"{sorted(lengths)}."
        )
    indices = [
        idx if idx.chunks[0] == tuple(row_chunks) else idx.rechunk((row_chunks,))
        for idx in indices
    ]
    if feature_names is None:
        feature_names = [
            f"{names[k]}__{j}" for k in range(n_sources) for j in range(len(cols[k]))
        ]
    elif len(feature_names) != n_cols:
        raise ValueError(
            f"got {len(feature_names)} feature names for {n_cols} target columns."
        )
    op = DaskFactorizedMatrix(
        base,
        None if base_k is None else cols[base_k],
        dims,
        indices,
        dim_cols,
        n_cols,
        dtype,
    )
    if persist:
        # Persisted before the checks, so that they read what every fit reads and
        # the index vectors (key look-ups, for frames) are computed only once.
        op = op.persist()
    # One pass on the cluster: index ranges and the base's finiteness.
    checks = [da.min(idx) for idx in op.indices] + [da.max(idx) for idx in op.indices]
    if op.base is not None:
        checks.append(da.isfinite(op.base).all())
    results = dask.compute(*checks)
    K = len(op.indices)
    for j in range(K):
        lo, hi, r = int(results[j]), int(results[K + j]), dims[j].shape[0]
        if lo < -1 or hi >= r:
            raise ValueError(
                f"index vector of source {dim_names[j]!r} holds values in "
                f"[{lo}, {hi}]; expected source rows in [-1, {r - 1}] (-1: no match)."
            )
    if op.base is not None and not bool(results[-1]):
        raise ValueError(f"source {names[base_k]!r} holds NaN or infinity.")
    logger.info("Dask dataset: %r", op)
    return MultiSourceDataset(op, feature_names, names, base_source=base_k)


def from_matrices_on_dask(
    cls: type,
    sources: Sequence[Any],
    indicators: Sequence[Any],
    mappings: Any,
    feature_names: Any,
    *,
    source_names: Any,
    priority: Any,
    dtype: Any,
    allow_nan: bool,
) -> Any:
    """A Dask source in ``MultiSourceDataset.from_matrices`` (the Dask source
    kind): the Dask-backed dataset of the same data."""
    if allow_nan:
        raise TypeError("allow_nan=True is not supported for Dask sources.")
    if mappings is not None or priority is not None:
        raise TypeError(
            "a Dask source needs a Dask-backed dataset, which takes the sources' "
            "columns in order: build it with ilargi_sklearn.distributed.dask_dataset "
            "(without mappings and priority)."
        )
    return dask_dataset(
        sources, indicators, feature_names, source_names=source_names, dtype=dtype
    )
