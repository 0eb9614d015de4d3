"""Row origin: the base-table row each dataset row comes from, and aligning
base-ordered values (a target, weights, groups) to the dataset's rows.

The functions here are methods of :class:`MultiSourceDataset` (assigned in its
class body, as pandas assigns ``DataFrame.hist``): ``self`` is the dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ilargi_sklearn._backend._namespace import asarray_on, device_of, get_namespace

__all__ = ["align", "base_rows", "n_base_rows", "set_origin"]


def set_origin(self, rows: np.ndarray | None, n_base_rows: int, index: Any) -> None:
    """Record the base row of each row (None: row ``i`` is base row ``i``)."""
    self._origin = (rows, int(n_base_rows), index)


def base_rows(self) -> np.ndarray:
    """The base-table row each dataset row comes from (-1: none).

    Inner joins drop base rows and one-to-many joins repeat them, so the
    dataset's rows are no longer the base table's: row ``i`` comes from base
    row ``base_rows_[i]``; -1 marks rows an outer join added from another table.
    It stays right through row slicing (``ds[rows]``), :meth:`union` (the parts'
    base tables one after the other), ``via`` joins and relationship tables
    without base features. Datasets built from matrices are their own base.
    Use :meth:`align` to take base-aligned values into dataset order.
    """
    rows = self._origin[0]
    if rows is None:
        rows = np.arange(self._root_operator.n_rows, dtype=np.int64)
    return rows.copy() if self._root_rows is None else rows[self._root_rows]


def n_base_rows(self) -> int:
    """Rows of the base table(s) the dataset was built from."""
    n = self._origin[1]
    return self._root_operator.n_rows if n is None else n


def align(self, values: Any, *, fill_value: Any = None) -> Any:
    """Take base-aligned values (target, weights, groups) into dataset order.

    Parameters
    ----------
    values : array-like, pandas.Series or pandas.DataFrame
        One value (or row) per row of the base table, in its order: for example
        ``base["price"]``, a weight per base row, the groups of ``GroupKFold``.
        A pandas object must carry the base frame's index (it is checked, so
        values of another frame or order are never matched by position);
        pass ``.to_numpy()`` to align by position.
    fill_value : scalar, optional
        The value of dataset rows without a base row (rows an outer join added).
        Default: such rows raise a ``ValueError``.

    Returns
    -------
    ndarray, pandas.Series or pandas.DataFrame
        ``values`` at :attr:`base_rows_`, one per dataset row; pandas objects
        get a fresh ``RangeIndex``.

    Examples
    --------
    >>> import pandas as pd
    >>> from ilargi_sklearn import Join, MultiSourceDataset
    >>> base = pd.DataFrame({"k": [1, 2, 3], "y": [10.0, 20.0, 30.0]})
    >>> dim = pd.DataFrame({"k": [1, 3, 3], "z": [0.5, 1.5, 2.5]})
    >>> ds = MultiSourceDataset.from_frames(
    ...     base,
    ...     joins=[
    ...         Join(dim, on="k", features=["z"], how="inner", validate="1:m")
    ...     ],
    ... )
    >>> ds.base_rows_
    array([0, 2, 2])
    >>> ds.align(base["y"]).tolist()
    [10.0, 30.0, 30.0]
    """
    rows = self.base_rows_
    n_base = self.n_base_rows_
    missing = rows < 0
    if missing.any() and fill_value is None:
        raise ValueError(
            f"{int(missing.sum()):,} dataset rows have no base row (an outer join "
            "added them); pass fill_value=..., or drop them first with "
            "ds[ds.base_rows_ >= 0]."
        )
    take = np.where(missing, 0, rows) if missing.any() else rows
    if isinstance(values, (pd.Series, pd.DataFrame)):
        _check_index(self, values, n_base)
        out = values.iloc[take].reset_index(drop=True)
        if missing.any():
            mask = (
                missing
                if out.ndim == 1
                else np.repeat(missing[:, None], out.shape[1], axis=1)
            )
            out = out.mask(mask, fill_value)
        return out
    if not hasattr(values, "__array_namespace__"):
        # Lists, polars and pyarrow columns: through NumPy.
        values = np.asarray(values)
    if values.ndim == 0 or values.shape[0] != n_base:
        raise ValueError(
            f"values have shape {tuple(values.shape)}, but the dataset was built "
            f"from {n_base:,} base rows; align takes one value per base row, in "
            "the base table's order."
        )
    if isinstance(values, np.ndarray):
        out = values[take]
        if missing.any():
            out = out.astype(np.result_type(out, np.asarray(fill_value)))
            out[missing] = fill_value
        return out
    xp = get_namespace(values)
    out = xp.take(values, asarray_on(take, xp, device_of(values)), axis=0)
    if missing.any():
        raise ValueError("fill_value is only supported for NumPy and pandas values.")
    return out


def _check_index(self, values: Any, n_base: int) -> None:
    if values.shape[0] != n_base:
        raise ValueError(
            f"values have {values.shape[0]:,} rows, but the dataset was built from "
            f"{n_base:,} base rows; align takes one value per base row, in the "
            "base table's order."
        )
    index = self._origin[2]
    if index is not None and not values.index.equals(index):
        raise ValueError(
            "the values' index differs from the base table's: they may come from "
            "another frame or another order. Pass values.to_numpy() if they are "
            "in the base table's row order."
        )
