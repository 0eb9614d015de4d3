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
* a reduction (``T.T @ Y``, the gram, the column statistics): each chunk returns a
  small partial (a ``(p, k)`` product of its base rows, or its rows summed into the
  source rows of one dimension, which is source-sized) and Dask sums the partials in
  a tree; the products with the dimension sources run once on the summed partials,
  on the cluster, and only parameter-sized results come back to the client.

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

from ilargi_sklearn._backend._namespace import get_namespace, is_numpy_namespace
from ilargi_sklearn._backend._ops import segment_sum
from ilargi_sklearn.dataset._operators import (
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


def _lead(func: Any, *args: Any, **kwargs: Any) -> np.ndarray:
    """``func(...)`` with a leading axis of length one (one partial per row chunk)."""
    return np.asarray(func(*args, **kwargs))[None]


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


def _base_t_chunk(B: np.ndarray, Y: np.ndarray, square: bool = False) -> np.ndarray:
    """``B^T Y`` (or ``(B * B)^T Y``) of one chunk."""
    return (B * B if square else B).T @ Y


def _base_gram_chunk(B: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    if w is None:
        return B.T @ B
    return (B * w[:, None]).T @ B


def _base_colsum_chunk(B: np.ndarray, square: bool = False) -> np.ndarray:
    return (B * B if square else B).sum(axis=0)


def _scatter_chunk(
    idx: np.ndarray, Y: np.ndarray, w: np.ndarray | None = None, *, n: int
) -> np.ndarray:
    """``I^T diag(w) Y`` of one chunk: its rows summed into ``n`` source rows."""
    return segment_sum(Y, idx, n, weights=w)


def _counts_chunk(idx: np.ndarray, w: np.ndarray | None = None, *, n: int, dtype):
    """``I^T w`` (``I^T 1`` when ``w`` is None) of one chunk."""
    v = np.ones(idx.shape[0], dtype=dtype) if w is None else w
    return segment_sum(v, idx, n).astype(dtype, copy=False)


def _cross_chunk(
    idx_a: np.ndarray,
    idx_b: np.ndarray,
    S_b: np.ndarray,
    w: np.ndarray | None = None,
    *,
    n: int,
) -> np.ndarray:
    """``I_a^T diag(w) I_b S_b`` of one chunk (source-sized: ``(r_a, c_b)``)."""
    return segment_sum(_pad_take(S_b, idx_b), idx_a, n, weights=w)


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


# ------------------------------------------------------------------- the operator
def _row_ind(ndim: int) -> tuple[str, ...]:
    return (_ROW,) if ndim == 1 else (_ROW, "k")


def _reduce(func: Any, args: list[Any], shape: tuple[int, ...], dtype: Any, **kw):
    """Sum over row chunks of ``func(chunk arguments)``, a ``shape`` array (lazy).

    ``args`` alternates arrays and their index labels; every label other than
    ``"row"`` is contracted (one chunk, passed whole).
    """
    new = {f"out{i}": int(s) for i, s in enumerate(shape)}
    parts = da.blockwise(
        functools.partial(_lead, func),
        (_ROW, *new),
        *args,
        new_axes=new,
        adjust_chunks={_ROW: 1},
        concatenate=True,
        dtype=dtype,
        meta=np.empty((0,) * (len(shape) + 1), dtype=dtype),
        **kw,
    )
    return parts.sum(axis=0)


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

    Notes
    -----
    Every target column is owned by exactly one source (no overlapping columns).
    ``matmul``, ``row_sq_norms`` and ``row_sums`` return lazy n-length Dask arrays;
    ``rmatmul``, ``gram`` and the column statistics return NumPy arrays computed by
    one tree reduction each.
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
        self.shape = (n_rows, int(n_cols))

    # ------------------------------------------------------------ properties
    @property
    def xp(self) -> Any:
        """The Dask array namespace (``array_api_compat.dask.array``)."""
        if self.base is not None:
            return get_namespace(self.base)
        return get_namespace(self.indices[0])

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

    # -------------------------------------------------------- operands on rows
    def _rows_operand(self, Y: Any, name: str) -> Any:
        """An n-length operand as a Dask array chunked like the fact table."""
        if not isinstance(Y, da.Array):
            Y = np.asarray(_as_host(Y))
            if Y.shape[:1] != (self.n_rows,):
                raise ValueError(
                    f"{name} has shape {Y.shape}; expected ({self.n_rows}, ...)."
                )
            return da.from_array(Y, chunks=(self.row_chunks,) + Y.shape[1:])
        if Y.shape[0] != self.n_rows:
            raise ValueError(
                f"{name} has shape {Y.shape}; expected ({self.n_rows}, ...)."
            )
        if Y.chunks[0] != self.row_chunks or any(len(c) > 1 for c in Y.chunks[1:]):
            Y = Y.rechunk((self.row_chunks,) + tuple(-1 for _ in Y.shape[1:]))
        return Y

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
    def rmatmul(self, Y: Any) -> np.ndarray:
        """``T.T @ Y`` as a NumPy array (partials per chunk, summed on the cluster)."""
        Y = self._rows_operand(Y, "left operand")
        dtype = np.result_type(self.dtype, Y.dtype)
        tail = tuple(int(s) for s in Y.shape[1:])
        y_ind = _row_ind(Y.ndim)
        parts: list[tuple[np.ndarray, Any]] = []
        if self.base is not None:
            p = self.base.shape[1]
            part = _reduce(
                _base_t_chunk,
                [self.base, (_ROW, "bc"), Y, y_ind],
                (p,) + tail,
                dtype,
            )
            parts.append((self.base_cols, part))
        for S, Sd, idx, cols in zip(
            self.dims, self.dims_on_cluster, self.indices, self.dim_cols
        ):
            R = _reduce(
                functools.partial(_scatter_chunk, n=S.shape[0]),
                [idx, (_ROW,), Y, y_ind],
                (S.shape[0],) + tail,
                dtype,
            )
            parts.append((cols, Sd.T @ R))
        out = np.zeros((self.n_cols,) + tail, dtype=dtype)
        for (cols, _), value in zip(parts, dask.compute(*(p for _, p in parts))):
            out[cols] += value
        return out

    def _weights(self, weights: Any) -> list[Any]:
        if weights is None:
            return []
        w = self._rows_operand(weights, "weights")
        if w.ndim != 1:
            raise ValueError(f"weights must be 1-D, got shape {w.shape}.")
        return [w, (_ROW,)]

    def _col_reduce(self, weights: Any, square: bool) -> np.ndarray:
        w = self._weights(weights)
        parts: list[tuple[np.ndarray, Any]] = []
        if self.base is not None:
            p = self.base.shape[1]
            if w:
                part = _reduce(
                    functools.partial(_base_t_chunk, square=square),
                    [self.base, (_ROW, "bc"), *w],
                    (p,),
                    self.dtype,
                )
            else:
                part = _reduce(
                    functools.partial(_base_colsum_chunk, square=square),
                    [self.base, (_ROW, "bc")],
                    (p,),
                    self.dtype,
                )
            parts.append((self.base_cols, part))
        for S, Sd, idx, cols in zip(
            self.dims, self.dims_on_cluster, self.indices, self.dim_cols
        ):
            cnt = _reduce(
                functools.partial(_counts_chunk, n=S.shape[0], dtype=self.dtype),
                [idx, (_ROW,), *w],
                (S.shape[0],),
                self.dtype,
            )
            parts.append((cols, (Sd * Sd if square else Sd).T @ cnt))
        out = np.zeros(self.n_cols, dtype=self.dtype)
        for (cols, _), value in zip(parts, dask.compute(*(p for _, p in parts))):
            out[cols] += value
        return out

    def col_sums(self, weights: Any = None) -> np.ndarray:
        """``weights @ T`` (column sums when None) as a NumPy array."""
        return self._col_reduce(weights, square=False)

    def col_sq_sums(self, weights: Any = None) -> np.ndarray:
        """``weights @ (T * T)`` as a NumPy array."""
        return self._col_reduce(weights, square=True)

    def gram(self, weights: Any = None, format: str = "auto") -> np.ndarray:
        """``T.T @ diag(weights) @ T`` as a dense NumPy array.

        Blocks: ``B^T W B`` from per-chunk partials; ``S_k^T diag(I_k^T w) S_k``
        from summed per-chunk counts; ``B^T W I_k S_k`` and ``S_a^T I_a^T W I_b S_b``
        from per-chunk scatters into the source rows of one side (source-sized),
        summed, then one product with that side's source on the cluster.
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
        blocks: list[tuple[np.ndarray, np.ndarray, Any]] = []
        if self.base is not None:
            p = self.base.shape[1]
            bb = _reduce(_base_gram_chunk, [self.base, (_ROW, "bc"), *w], (p, p), dt)
            blocks.append((self.base_cols, self.base_cols, bb))
        K = len(self.dims)
        for a in range(K):
            Sa, Sad, ia, ca = (
                self.dims[a],
                self.dims_on_cluster[a],
                self.indices[a],
                self.dim_cols[a],
            )
            ra = Sa.shape[0]
            cnt = _reduce(
                functools.partial(_counts_chunk, n=ra, dtype=dt),
                [ia, (_ROW,), *w],
                (ra,),
                dt,
            )
            blocks.append((ca, ca, (Sad * cnt[:, None]).T @ Sad))
            if self.base is not None:
                p = self.base.shape[1]
                R = _reduce(
                    functools.partial(_scatter_chunk, n=ra),
                    [ia, (_ROW,), self.base, (_ROW, "bc"), *w],
                    (ra, p),
                    dt,
                )
                blocks.append((ca, self.base_cols, Sad.T @ R))
            for b in range(a + 1, K):
                Sb, Sbd, ib, cb = (
                    self.dims[b],
                    self.dims_on_cluster[b],
                    self.indices[b],
                    self.dim_cols[b],
                )
                # Scatter into the smaller source's rows.
                if ra <= Sb.shape[0]:
                    R = _reduce(
                        functools.partial(_cross_chunk, n=ra),
                        [ia, (_ROW,), ib, (_ROW,), Sbd, self._dim_ind(b), *w],
                        (ra, Sb.shape[1]),
                        dt,
                    )
                    blocks.append((ca, cb, Sad.T @ R))
                else:
                    R = _reduce(
                        functools.partial(_cross_chunk, n=Sb.shape[0]),
                        [ib, (_ROW,), ia, (_ROW,), Sad, self._dim_ind(a), *w],
                        (Sb.shape[0], Sa.shape[1]),
                        dt,
                    )
                    blocks.append((cb, ca, Sbd.T @ R))
        n = self.n_cols
        G = np.zeros((n, n), dtype=dt)
        values = dask.compute(*(B for _, _, B in blocks))
        for (rc, cc, _), B in zip(blocks, values):
            G[np.ix_(rc, cc)] += B
            if rc is not cc:
                G[np.ix_(cc, rc)] += np.asarray(B).T
        return G

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
        """The same operator with base, index vectors and sources held in memory."""
        base, indices, dims = dask.persist(
            self.base, self.indices, self.dims_on_cluster
        )
        return DaskFactorizedMatrix(
            base,
            self.base_cols,
            self.dims,
            list(indices),
            self.dim_cols,
            self.n_cols,
            self.dtype,
            dims_on_cluster=list(dims),
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
        """A :class:`MatrixOperator` over the lazy joined Dask array."""
        return MatrixOperator(self.materialize("dense"))

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
    from ilargi_sklearn.dataset import MultiSourceDataset
    from ilargi_sklearn.dataset._multi_source import _check_dtype, _check_source_names

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
    # One pass on the cluster: index ranges and the base's finiteness.
    checks = [da.min(idx) for idx in indices] + [da.max(idx) for idx in indices]
    if base is not None:
        checks.append(da.isfinite(base).all())
    results = dask.compute(*checks)
    K = len(indices)
    for j in range(K):
        lo, hi, r = int(results[j]), int(results[K + j]), dims[j].shape[0]
        if lo < -1 or hi >= r:
            raise ValueError(
                f"index vector of source {dim_names[j]!r} holds values in "
                f"[{lo}, {hi}]; expected source rows in [-1, {r - 1}] (-1: no match)."
            )
    if base is not None and not bool(results[-1]):
        raise ValueError(f"source {names[base_k]!r} holds NaN or infinity.")

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
        op = op.persist()
    logger.info("Dask dataset: %r", op)
    return MultiSourceDataset(op, feature_names, names, base_source=base_k)
