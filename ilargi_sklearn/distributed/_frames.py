"""A Dask-backed dataset from a ``dask.dataframe`` fact table and in-memory joins.

The fact table is a ``dask.dataframe.DataFrame`` whose partitions become the row
chunks; every joined table is a small pandas DataFrame, encoded once on the client
(the same encoding as :func:`~ilargi_sklearn.multisource.from_frames`) and broadcast.
Keys are mapped to row positions once, on the cluster: each partition looks its
key columns up in the joined table's key index (``pandas.Index.get_indexer``, -1
for no match), and snowflake joins compose the resulting index vectors chunk by
chunk. No feature column of a joined table is ever repeated per fact row.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ilargi_sklearn.distributed._dask import dask_dataset
from ilargi_sklearn.multisource._builder import (
    VALIDATE,
    Join,
    _as_list,
    _check_columns,
    _check_join,
    _key_frame,
)
from ilargi_sklearn.multisource._encoding import derive_encoding, encode_table

__all__ = ["dask_from_frames"]

logger = logging.getLogger(__name__)


def _key_index(
    table: pd.DataFrame, keys: list[str], label: str, nulls_equal: bool
) -> tuple[pd.Index, np.ndarray | None, bool]:
    """The joined table's key index and the table row of each index position.

    Rows with a missing key are left out unless ``nulls_equal`` (they can match
    nothing); the positions are then the kept rows (None: all rows, in order).
    """
    keep = None if nulls_equal else table[keys].notna().all(axis=1).to_numpy()
    positions = None if keep is None or keep.all() else np.flatnonzero(keep)
    sub = table if positions is None else table.iloc[positions]
    index = (
        pd.Index(sub[keys[0]])
        if len(keys) == 1
        else pd.MultiIndex.from_frame(sub[keys])
    )
    if not index.is_unique:
        dup = index[index.duplicated()][:3].tolist()
        raise ValueError(
            f"join {label!r}: key values {dup} occur more than once in the joined "
            "table; a Dask-backed dataset supports many-to-one joins only (one row "
            "per key), deduplicate the table or join it in memory with from_frames."
        )
    return index, positions, nulls_equal


def _lookup(
    part: pd.DataFrame, keys: list[str], key_index: tuple[pd.Index, Any, bool]
) -> np.ndarray:
    """Table rows of one partition's keys (-1: no match).

    A missing key matches nothing, as in ``from_frames`` (SQL's rule), unless the
    join has ``nulls_equal``.
    """
    index, positions, nulls_equal = key_index
    probe = (
        pd.Index(part[keys[0]])
        if len(keys) == 1
        else pd.MultiIndex.from_frame(part[keys])
    )
    rows = index.get_indexer(probe).astype(np.int64, copy=False)
    if positions is not None:
        rows = np.where(rows >= 0, positions[np.maximum(rows, 0)], -1)
    if not nulls_equal:
        null = part[keys].isna().any(axis=1).to_numpy()
        if null.any():
            rows[null] = -1
    return rows


def _partition_rows(part: pd.DataFrame, keys: list[str], key_index: Any) -> pd.Series:
    return pd.Series(_lookup(part, keys, key_index), index=part.index, dtype="int64")


def _compose(left: np.ndarray, via_rows: np.ndarray) -> np.ndarray:
    """``via_rows[left]`` with -1 kept (a row the ``via`` table missed matches nothing)."""
    out = np.full(left.shape[0], -1, dtype=np.int64)
    hit = left >= 0
    out[hit] = via_rows[left[hit]]
    return out


def dask_from_frames(
    base: Any,
    base_features: Sequence[str] = (),
    joins: Sequence[Join] = (),
    *,
    base_name: str = "base",
    dtype: Any = np.float64,
    persist: bool = True,
) -> Any:
    """A Dask-backed :class:`~ilargi_sklearn.MultiSourceDataset` from DataFrames.

    The Dask counterpart of :func:`~ilargi_sklearn.multisource.from_frames` for a star
    or snowflake schema whose fact table does not fit one machine.

    Parameters
    ----------
    base : dask.dataframe.DataFrame
        The fact table; its partitions become the row chunks (sizes are computed
        once).
    base_features : list of str, default=()
        Numeric feature columns of the fact table.
    joins : list of Join
        Many-to-one joins of pandas tables (``how="left"``; ``via`` for snowflake
        schemas; ``categorical``, ``impute`` and ``indicator`` as in
        ``from_frames``). Joined sources are stored dense.
    base_name : str, default="base"
        Source name of the fact table.
    dtype : {np.float64, np.float32}, default=np.float64
    persist : bool, default=True
        Hold the fact table and the index vectors in cluster memory.

    Returns
    -------
    MultiSourceDataset
        Backed by a :class:`~ilargi_sklearn.distributed.DaskFactorizedMatrix`.

    Raises
    ------
    ValueError
        For joins other than left joins, duplicated keys in a joined table (not
        many-to-one), unknown columns or ``via`` names.
    TypeError
        For key columns of incompatible kinds, or a non-numeric fact-table feature.

    See Also
    --------
    ilargi_sklearn.multisource.from_frames : The in-memory builder (all join types).
    dask_dataset : The same dataset from Dask arrays and index vectors.

    Notes
    -----
    Inner, outer and one-to-many joins change the set of target rows, which would
    reshuffle the fact table's partitions; they are not supported here, so the
    dataset's rows are the fact table's (``ds.base_rows_`` is ``arange``, and
    ``ds.align`` returns base-aligned values as they are). Unmatched rows of a left
    join take zeros (add ``indicator=True`` for a matched flag); missing keys match
    nothing unless ``Join(nulls_equal=True)``, as in ``from_frames``. Categories are
    those of the whole joined table (which of its rows the fact table takes is only
    known on the cluster).

    Examples
    --------
    >>> import numpy as np, pandas as pd, dask.dataframe as dd
    >>> from ilargi_sklearn.multisource import Join
    >>> facts = dd.from_pandas(
    ...     pd.DataFrame({"x": [1.0, 2.0, 3.0], "k": [7, 8, 9]}), npartitions=2
    ... )
    >>> dim = pd.DataFrame({"k": [8, 7], "z": [20.0, 10.0]})
    >>> ds = dask_from_frames(facts, ["x"], [Join(dim, on="k", features=["z"])])
    >>> list(ds.feature_names)
    ['base__x', 'join0__z']
    >>> (ds @ np.ones(2)).compute()
    array([11., 22.,  3.])
    """
    import dask.dataframe as dd

    if not isinstance(base, dd.DataFrame):
        raise TypeError(
            f"base must be a dask.dataframe.DataFrame, got {type(base).__name__}; "
            "use ilargi_sklearn.multisource.from_frames for pandas tables."
        )
    base_features = _as_list(base_features)
    _check_columns(base, base_features, "features", base_name)
    bad = [c for c in base_features if not pd.api.types.is_numeric_dtype(base[c].dtype)]
    if bad:
        raise TypeError(
            f"fact-table features {bad} are not numeric; encode them before building "
            "a Dask-backed dataset (joined tables may be categorical)."
        )

    tables: dict[str, Any] = {base_name: base}
    rows: dict[str, Any] = {}  # index vector (Dask array) of each joined table
    sources, indicators, names, feature_names = [], [], [], []
    base_arr = None
    if base_features:
        base_arr = base[base_features].astype(dtype).to_dask_array(lengths=True)
        sources.append(base_arr)
        indicators.append(None)
        names.append(base_name)
        feature_names += [f"{base_name}__{c}" for c in base_features]
    lengths = None if base_arr is None else base_arr.chunks[0]

    for i, j in enumerate(joins):
        label, R, left_name, L, lk, rk, features, forced = _check_join(
            i,
            j,
            tables,
            base_name,
            ("left",),
            # The fact table is a dask.dataframe: its columns' dtypes from _meta.
            kind_of=lambda name, col: (
                tables[name][col]._meta if name == base_name else tables[name][col]
            ),
            why="a Dask-backed dataset keeps the fact table's rows: left joins only",
        )
        if VALIDATE.get(j.validate) in ("one_to_one", "one_to_many"):
            raise ValueError(
                f"join {label!r}: validate={j.validate!r} checks the fact table's "
                "keys for repeats, which a Dask-backed dataset does not do; its joins "
                "are many-to-one (a joined table with a repeated key is refused), so "
                "leave validate out or pass 'many_to_one'."
            )
        index = _key_index(_key_frame(R, j), rk, label, j.nulls_equal)
        if left_name == base_name:
            # On the cluster, once: each partition looks its keys up.
            idx = base.map_partitions(
                _partition_rows, lk, index, meta=(label, "int64")
            ).to_dask_array(lengths=lengths if lengths is not None else True)
            if lengths is None:
                lengths = idx.chunks[0]
        else:
            # Snowflake: the via table's rows map to this table's rows (small, on
            # the client); the fact rows compose that map chunk by chunk.
            via_rows = _lookup(L, lk, index)
            idx = rows[left_name].map_blocks(_compose, via_rows, dtype=np.int64)
        rows[label] = idx
        tables[label] = R
        # Categories are those of the whole joined table: which of its rows the
        # fact table takes is only known on the cluster.
        hint = "impute=... on its Join"
        enc, codes_of = derive_encoding(
            R, features, forced, j.impute, j.indicator, label, None, hint
        )
        S, _ = encode_table(
            R, enc, np.dtype(dtype), False, codes_of=codes_of, impute_hint=hint
        )
        fnames = enc.feature_names
        if S is None or S.shape[1] == 0:
            continue
        sources.append(np.asarray(S.toarray() if hasattr(S, "toarray") else S))
        indicators.append(idx)
        names.append(label)
        feature_names += list(fnames)
    if not sources:
        raise ValueError(
            "no features selected: give base_features or Join(features=...)."
        )
    logger.info("Dask dataset from frames: sources %s", names)
    return dask_dataset(
        sources,
        indicators,
        feature_names,
        source_names=names,
        dtype=dtype,
        persist=persist,
    )
