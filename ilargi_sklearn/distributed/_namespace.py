"""The array namespace that a Dask-backed operator reports to the kernels.

The device kernels of the estimators (``*_xp`` functions) are written against the
array-API standard and treat every array as living "on the device". On a cluster
that is right only for the n-length arrays (row chunks that stay on the workers);
parameter-sized arrays (centers, coefficients, ``H``, per-cluster sums) must be
plain NumPy on the client, otherwise every iteration grows a lazy graph and fitted
attributes come out as Dask arrays. :class:`DaskNamespace` is
``array_api_compat.dask.array`` with that policy:

* a call whose array arguments are all NumPy (or scalars) runs in NumPy;
* a call on Dask arrays runs in Dask; its result stays a lazy Dask array when one of
  its axes is the operator's row axis (``n_rows`` long), and is computed to NumPy
  otherwise (it is parameter-sized);
* ``argmin`` / ``argmax`` over rows (cluster labels, reused several times per
  iteration) are persisted on the cluster;
* ``asarray`` and the creation functions give Dask arrays, chunked and placed like
  the operator's rows, only for n-length arrays;
* ``take_along_axis`` (missing from ``array_api_compat.dask.array``) is a blockwise
  ``numpy.take_along_axis``; ``searchsorted`` accepts a NumPy right-hand side;
  ``linalg`` dispatches on its argument's type the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np

__all__ = ["DaskNamespace"]

_CREATION = frozenset({"zeros", "ones", "empty", "full"})
_PERSIST = frozenset({"argmin", "argmax"})


def _has_dask(values: Any) -> bool:
    for v in values:
        if isinstance(v, da.Array):
            return True
        if isinstance(v, (list, tuple)) and _has_dask(v):
            return True
    return False


class _Linalg:
    """``xp.linalg``: NumPy for NumPy arguments, Dask otherwise (same policy)."""

    def __init__(self, owner: DaskNamespace) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        import array_api_compat.dask.array as dxp
        import array_api_compat.numpy as nxp

        dask_f = getattr(dxp.linalg, name)
        numpy_f = getattr(nxp.linalg, name)
        owner = self._owner

        def call(*args: Any, **kwargs: Any) -> Any:
            if not _has_dask(args) and not _has_dask(kwargs.values()):
                return numpy_f(*args, **kwargs)
            # n-length factors (``Q`` of a QR) are reused: persisted.
            return owner._settle(dask_f(*args, **kwargs), persist=True)

        call.__name__ = name
        return call


class DaskNamespace:
    """``array_api_compat.dask.array`` bound to one operator's row chunks.

    Parameters
    ----------
    row_chunks : tuple of int
        Row chunks of the operator; an array with an axis of ``sum(row_chunks)``
        entries is an n-length array and stays on the cluster.
    to_rows : callable, optional
        Turns an n-length NumPy array into a Dask array chunked (and placed) like
        the operator's rows; ``dask.array.from_array`` with the row chunks when None.

    Notes
    -----
    Results are classified by shape: with fewer rows than columns or clusters an
    array could be mistaken for a row array; the estimators' inputs always have an
    ``n_rows`` different from their parameter sizes except in degenerate tests.
    """

    __name__ = "ilargi_sklearn.distributed.dask_namespace"

    def __init__(
        self,
        row_chunks: tuple[int, ...],
        to_rows: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        import array_api_compat.dask.array as dxp
        import array_api_compat.numpy as nxp

        self.row_chunks = tuple(int(c) for c in row_chunks)
        self.n_rows = sum(self.row_chunks)
        self._dxp = dxp
        self._nxp = nxp
        self._to_rows = to_rows
        self.linalg = _Linalg(self)

    def __repr__(self) -> str:
        return f"DaskNamespace(n_rows={self.n_rows}, chunks={len(self.row_chunks)})"

    # ------------------------------------------------------------------ policy
    def _is_rows(self, shape: tuple[int, ...]) -> bool:
        return any(int(s) == self.n_rows for s in shape)

    def _settle(self, out: Any, persist: bool = False) -> Any:
        """Compute parameter-sized Dask results; keep (or persist) n-length ones."""
        if isinstance(out, tuple):
            lazy = [o for o in out if isinstance(o, da.Array)]
            rows = [o for o in lazy if self._is_rows(o.shape)]
            small = [o for o in lazy if not self._is_rows(o.shape)]
            if persist and rows:
                # One graph: the row factors are persisted, the small ones computed.
                held = dask.persist(*rows)
                rows_map = dict(zip(map(id, rows), held))
            else:
                rows_map = {}
            values = dict(zip(map(id, small), dask.compute(*small))) if small else {}
            return tuple(
                np.asarray(values[id(o)]) if id(o) in values else rows_map.get(id(o), o)
                for o in out
            )
        if not isinstance(out, da.Array):
            return out
        if self._is_rows(out.shape):
            return out.persist() if persist else out
        return np.asarray(out.compute())

    def rows_array(self, x: np.ndarray) -> Any:
        """An n-length NumPy array as a Dask array chunked like the rows."""
        if self._to_rows is not None:
            return self._to_rows(x)
        return da.from_array(x, chunks=(self.row_chunks,) + x.shape[1:])

    # --------------------------------------------------------------- functions
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self._dxp, name)
        if not callable(value) or isinstance(value, type):
            return value  # dtypes, constants
        numpy_f = getattr(self._nxp, name, None)
        persist = name in _PERSIST

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not _has_dask(args) and not _has_dask(kwargs.values()):
                return numpy_f(*args, **kwargs)
            return self._settle(value(*args, **kwargs), persist=persist)

        if name in _CREATION:
            return self._creation(name, call)
        self.__dict__[name] = call  # cached: built once per name
        return call

    def _creation(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def create(shape: Any, *args: Any, **kwargs: Any) -> Any:
            shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
            if shape and int(shape[0]) == self.n_rows:
                kwargs.pop("device", None)
                dtype = kwargs.pop("dtype", None)
                chunks = (self.row_chunks,) + tuple(shape[1:])
                f = getattr(da, name)
                return f(shape, *args, dtype=dtype, chunks=chunks, **kwargs)
            return call(shape, *args, **kwargs)

        return create

    def asarray(self, x: Any, /, *, dtype: Any = None, device: Any = None, copy=None):
        """NumPy for parameter-sized data; n-length data as row-chunked Dask."""
        if isinstance(x, da.Array):
            return x if dtype is None else x.astype(dtype)
        arr = np.asarray(x, dtype=dtype)
        if arr.ndim and arr.shape[0] == self.n_rows:
            return self.rows_array(arr)
        return self._nxp.asarray(arr, copy=copy)

    def take_along_axis(self, x: Any, indices: Any, /, *, axis: int = -1) -> Any:
        """``numpy.take_along_axis`` chunk by chunk (rows are never the axis)."""
        if not isinstance(x, da.Array) and not isinstance(indices, da.Array):
            return np.take_along_axis(x, indices, axis=axis)
        axis = axis % x.ndim
        if axis == 0:
            raise ValueError(
                "take_along_axis over the row axis of a Dask array is not supported."
            )
        x = da.asarray(x).rechunk({axis: -1})
        indices = da.asarray(indices).rechunk({0: x.chunks[0], axis: -1})
        return da.map_blocks(
            np.take_along_axis,
            x,
            indices,
            axis=axis,
            dtype=x.dtype,
            chunks=indices.chunks,
        )

    def searchsorted(self, x1: Any, x2: Any, /, *, side: str = "left", sorter=None):
        if not isinstance(x1, da.Array) and not isinstance(x2, da.Array):
            return self._nxp.searchsorted(x1, x2, side=side, sorter=sorter)
        x2 = x2 if isinstance(x2, da.Array) else da.from_array(np.asarray(x2))
        return self._settle(self._dxp.searchsorted(x1, x2, side=side, sorter=sorter))
