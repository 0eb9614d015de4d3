"""``from_frames``: a dataset from DataFrames and joins, the package's entry point.

It turns the arguments into a :class:`DatasetSchema` (or takes a given one) and has
the join builder build it. It stands above the builder and the schema (both of
which make datasets), so :meth:`MultiSourceDataset.from_frames` cannot import it:
this module registers it with ``multisource._matrices`` (the container's
constructors) when it loads, and ``import ilargi_sklearn.multisource`` always
loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ilargi_sklearn.multisource._builder import (
    DEFAULT_MIN_MATCH,
    Join,
    _as_list,
    build,
)
from ilargi_sklearn.multisource._encoding import Impute
from ilargi_sklearn.multisource._matrices import _check_dtype, register_frames_builder
from ilargi_sklearn.multisource._schema import DatasetSchema

__all__ = ["from_frames"]


def from_frames(
    base: Any,
    base_features: Sequence[str] = (),
    joins: Sequence[Join] | Mapping[str, Any] = (),
    *,
    base_name: str = "base",
    base_categorical: Sequence[str] = (),
    base_impute: Impute = None,
    sparse: bool = True,
    coalesce: Sequence[str] = (),
    priority: Sequence[str] | None = None,
    dtype: Any = None,
    min_match: float = DEFAULT_MIN_MATCH,
    target: str | None = None,
    schema: Any = None,
    handle_unknown: str = "warn",
) -> Any:
    """Build a :class:`MultiSourceDataset` from DataFrames and joins.

    Parameters
    ----------
    base : pandas.DataFrame, polars.DataFrame or pyarrow.Table
        The table whose rows are the samples (a relationship table of keys only is
        fine: give no ``base_features``).
    base_features : list of str, default=()
        Feature columns of the base table.
    joins : list of Join, or dict of {name: table} with ``schema``
        The joins, applied in order; ``via`` names an earlier join.
    base_name : str, default="base"
        Source name of the base table.
    base_categorical, base_impute
        As ``Join.categorical`` and ``Join.impute``, for the base table.
    sparse : bool, default=True
        One-hot encoded sources are stored as CSR (dense when False).
    coalesce : list of str, default=()
        Column names that several tables supply and that form one target column
        (named after its owner). Ownership per target row follows ``priority``.
    priority : list of str, optional
        Source names from highest to lowest ownership priority for coalesced
        columns; default the order base, then joins.
    dtype : {np.float64, np.float32}, default=np.float64
    min_match : float, default=0.5
        A join whose matched fraction of rows is below this warns
        (:class:`JoinMatchWarning`, with unmatched keys and likely key mistakes);
        a join that matches no row raises a ``ValueError``. ``min_match=0`` allows
        any rate. ``Join(min_match=...)`` overrides it per join. At any rate, a
        known key mistake that explains unmatched keys warns.
    target : str, optional
        A column of the base table to return in dataset order (see Returns).
    schema : DatasetSchema, optional
        Encode with a dataset's schema (``train_ds.schema_``) instead of fitting a
        new encoding: the same features in the same order, the training
        categories and imputation values. ``joins`` then gives the new tables,
        either as the same ``Join`` list as for training (with new tables) or as a
        dict of source name to table; the other specification arguments must be
        left out or equal the schema's. Same as ``schema.build(base, joins)``.
    handle_unknown : {"warn", "ignore", "error"}, default="warn"
        With ``schema``: what a category the training data did not have becomes.
        "warn" encodes it as an all-zero row with one
        :class:`UnknownCategoryWarning` naming the columns and a few values,
        "ignore" does the same silently, "error" raises a ``ValueError``.

    Returns
    -------
    MultiSourceDataset
        With ``schema_`` (the encoding, to build new data alike),
        ``match_report_`` (a DataFrame, one row per join), ``base_rows_`` (the base
        row of each dataset row) and :meth:`~MultiSourceDataset.align`.
    y : pandas.Series
        Only with ``target``: the target column in dataset order,
        ``ds.align(base[target], fill_value=np.nan)`` (NaN on rows an outer join
        added, which have no base row).

    Notes
    -----
    Many-to-one joins keep the base table's row order; inner joins drop unmatched
    rows in order; one-to-many joins repeat a target row once per match, matches in
    the joined table's order (with a :class:`JoinFanOutWarning` unless the join
    declares ``validate="one_to_many"`` or ``"many_to_many"``); outer joins append the joined table's unmatched rows at
    the end (pandas sorts outer-join keys instead; compare as sets). Missing keys
    (NaN, None, NaT) match nothing, as in SQL, unless ``Join(nulls_equal=True)``
    (pandas.merge's rule); a target row that a ``via`` table did not match matches
    nothing further. Categories are the values that occur in the dataset's rows,
    sorted (as ``OneHotEncoder`` on the joined table): a value only rows outside
    the join have, or an unused level of a pandas Categorical, gets no column.
    """
    if schema is not None:
        if not isinstance(schema, DatasetSchema):
            raise TypeError(
                f"schema must be a DatasetSchema (a dataset's schema_), got "
                f"{type(schema).__name__}."
            )
        given = {
            "base_features": _as_list(base_features),
            "base_name": base_name,
            "base_categorical": _as_list(base_categorical),
            "base_impute": base_impute,
            "sparse": sparse,
            "coalesce": _as_list(coalesce),
            "priority": None if priority is None else list(priority),
            "dtype": dtype,
        }
        schema._check_arguments(given)
        return schema.build(
            base,
            joins,
            target=target,
            handle_unknown=handle_unknown,
            min_match=min_match,
        )

    if isinstance(joins, Mapping):
        raise TypeError(
            "joins given as a dict of tables need schema=...; without a schema, "
            "give a list of Join specifications."
        )
    joins = list(joins)
    for i, j in enumerate(joins):
        if not isinstance(j, Join):
            raise TypeError(f"joins[{i}] must be a Join, got {type(j).__name__}.")
    spec = DatasetSchema(
        base_name=base_name,
        base_features=tuple(_as_list(base_features)),
        base_categorical=tuple(_as_list(base_categorical)),
        base_impute=base_impute,
        joins=tuple(j.spec() for j in joins),
        sparse=bool(sparse),
        coalesce=tuple(_as_list(coalesce)),
        priority=None if priority is None else tuple(priority),
        dtype=str(_check_dtype(np.float64 if dtype is None else dtype)),
    )
    return build(
        spec,
        base,
        [j.table for j in joins],
        target=target,
        handle_unknown=handle_unknown,
        min_match=min_match,
    )


register_frames_builder(from_frames)
