"""DatasetSchema: a dataset's whole encoding, to build new data exactly alike."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ilargi_sklearn.multisource._builder import (
    DEFAULT_MIN_MATCH,
    Join,
    _as_list,
    _join_fields,
    build,
)
from ilargi_sklearn.multisource._encoding import Impute, TableEncoding

__all__ = ["DatasetSchema"]


@dataclass(frozen=True)
class DatasetSchema:
    """The encoding of a dataset built from frames: how to build new data alike.

    A dataset built by :func:`~ilargi_sklearn.multisource.from_frames` records its
    schema as ``ds.schema_``: the tables and their joins, the feature columns of
    each, the categories of every one-hot column (in column order), the
    imputation values, the coalescing rule and the dtype. Building new frames with
    it (:meth:`build`, or ``from_frames(..., schema=ds.schema_)``) gives exactly
    the training features, whatever categories the new frames hold, so that a
    model fitted on the training dataset scores the new one. It holds no data, is
    small, pickles, and a fitted estimator keeps it as ``dataset_schema_``.

    Attributes
    ----------
    base_name : str
        Source name of the base table.
    base_features, base_categorical : tuple of str
        The base table's feature and forced-categorical columns.
    base_impute : str, float or None
        The base table's imputation.
    joins : tuple of Join
        The joins, without their tables.
    sparse : bool
        Whether one-hot sources are CSR.
    coalesce : tuple of str
        Coalesced column names.
    priority : tuple of str or None
        Ownership priority of coalesced columns.
    dtype : str
        "float64" or "float32".
    encodings : tuple of TableEncoding
        One per table, in build order: categories and imputation values.
    feature_names : tuple of str
        The dataset's features, in order.
    match_rates : tuple of float
        Each join's matched fraction in training. A new batch's rate is flagged
        (``min_match``) only when it is also implausibly low for that rate: a few
        new rows may all miss a join by chance.

    Examples
    --------
    >>> import pandas as pd
    >>> from ilargi_sklearn import Join, MultiSourceDataset
    >>> dim = pd.DataFrame({"k": [1, 2], "color": ["red", "blue"]})
    >>> train = pd.DataFrame({"x": [1.0, 2.0, 3.0], "k": [1, 2, 1]})
    >>> ds = MultiSourceDataset.from_frames(
    ...     train, ["x"], [Join(dim, on="k", features=["color"], name="dim")]
    ... )
    >>> list(ds.feature_names)
    ['base__x', 'dim__color_blue', 'dim__color_red']
    >>> new = ds.schema_.build(pd.DataFrame({"x": [5.0], "k": [1]}), {"dim": dim})
    >>> list(new.feature_names) == list(ds.feature_names)
    True
    >>> new.materialize().toarray()
    array([[5., 0., 1.]])
    """

    base_name: str
    base_features: tuple[str, ...]
    base_categorical: tuple[str, ...]
    base_impute: Impute
    joins: tuple[Join, ...]
    sparse: bool
    coalesce: tuple[str, ...]
    priority: tuple[str, ...] | None
    dtype: str
    encodings: tuple[TableEncoding, ...] = ()
    feature_names: tuple[str, ...] = ()
    match_rates: tuple[float, ...] = ()

    # ------------------------------------------------------------ properties
    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def source_names(self) -> list[str]:
        """The base table's name, then the joins' names, in build order."""
        return [self.base_name] + [
            j.name if j.name is not None else f"join{i}"
            for i, j in enumerate(self.joins)
        ]

    @property
    def categories(self) -> dict[str, list[Any]]:
        """The categories of every one-hot column (``"{source}__{column}"``)."""
        return {k: v for e in self.encodings for k, v in e.categories.items()}

    def __repr__(self) -> str:
        joins = ", ".join(self.source_names[1:]) or "no joins"
        return (
            f"DatasetSchema({self.n_features} features from {self.base_name!r} and "
            f"{len(self.joins)} joins ({joins}); {self.dtype})"
        )

    # ------------------------------------------------------------ building
    def build(
        self,
        base: Any,
        tables: Mapping[str, Any] | Sequence[Join] | None = None,
        *,
        target: str | None = None,
        handle_unknown: str = "warn",
        min_match: float = DEFAULT_MIN_MATCH,
    ) -> Any:
        """Build a dataset from new frames with this encoding.

        Parameters
        ----------
        base : pandas.DataFrame, polars.DataFrame or pyarrow.Table
            The new base rows (for example the rows to score).
        tables : dict of {source name: table} or list of Join
            The joined tables, by the joins' source names (a table joined twice, as
            airports for origin and destination, is given under both names), or the
            training ``Join`` list with new tables: its specifications must equal
            the schema's.
        target : str, optional
            A base column to return in dataset order, as in ``from_frames``.
        handle_unknown : {"warn", "ignore", "error"}, default="warn"
            Categories the training data did not have: all-zero rows with one
            :class:`~ilargi_sklearn.multisource.UnknownCategoryWarning` ("warn"),
            silently ("ignore"), or a ``ValueError`` ("error").
        min_match : float, default=0.5
            As in ``from_frames``.

        Returns
        -------
        MultiSourceDataset
            With exactly ``feature_names``, and ``schema_`` this schema (and the
            target with ``target``).
        """
        if not self.encodings:
            raise ValueError(
                "this schema has no encodings yet: take a built dataset's schema_."
            )
        frames, checks = self._tables(tables)
        return build(
            self,
            base,
            frames,
            target=target,
            handle_unknown=handle_unknown,
            min_match=min_match,
            checks=checks,
        )

    def _tables(self, tables: Any) -> tuple[list[Any], list[Join] | None]:
        """The joined tables in join order, from a dict or a list of Joins, and
        the Joins (whose checks, ``min_match`` and ``validate``, apply)."""
        names = self.source_names[1:]
        if tables is None:
            tables = {}
        if isinstance(tables, Mapping):
            missing = [n for n in names if n not in tables]
            extra = [n for n in tables if n not in names]
            if missing or extra:
                raise ValueError(
                    f"the schema joins the tables {names}; "
                    + (f"missing: {missing}" if missing else "")
                    + ("; " if missing and extra else "")
                    + (f"unknown: {extra}" if extra else "")
                    + "."
                )
            return [tables[n] for n in names], None
        tables = list(tables)
        if len(tables) != len(names):
            raise ValueError(
                f"the schema has {len(names)} joins ({names}), got {len(tables)} Joins."
            )
        encodings = {e.name: e for e in self.encodings}
        for i, (j, spec) in enumerate(zip(tables, self.joins)):
            if not isinstance(j, Join):
                raise TypeError(f"joins[{i}] must be a Join, got {type(j).__name__}.")
            _check_equivalent(names[i], spec, j, encodings.get(names[i]))
        return [j.table for j in tables], tables

    def _check_arguments(self, given: dict[str, Any]) -> None:
        """``from_frames`` arguments next to ``schema=``: unset or the schema's."""
        defaults = {
            "base_features": [],
            "base_name": "base",
            "base_categorical": [],
            "base_impute": None,
            "sparse": True,
            "coalesce": [],
            "priority": None,
            "dtype": None,
        }
        for name, value in given.items():
            mine = getattr(self, name)
            if name == "dtype" and value is not None:
                value = str(np.dtype(value))
            if _same(value, mine) or _same(value, defaults[name]):
                continue
            raise ValueError(
                f"{name}={value!r} differs from the schema's {name}={mine!r}; with "
                "schema=..., leave it out."
            )

    # ------------------------------------------------------------ lookup
    @classmethod
    def of(cls, model: Any) -> DatasetSchema | None:
        """The schema a fitted model was trained with (None if not on a dataset).

        Looks through ``Pipeline`` steps and meta-estimators (``AutoPlan``'s
        fitted ``estimator_``) for the ``dataset_schema_`` that fitting on a
        dataset records.
        """
        schema = getattr(model, "dataset_schema_", None)
        if isinstance(schema, cls):
            return schema
        for step in getattr(model, "steps", None) or []:
            found = cls.of(step[1])
            if found is not None:
                return found
        inner = getattr(model, "estimator_", None)
        return None if inner is None or inner is model else cls.of(inner)


#: Join fields that say what the join is (the others, ``min_match`` and
#: ``validate``, are checks: a scoring run may set its own).
_CHECKS = ("min_match", "validate")
#: Fields compared by meaning rather than as written.
_MEANING = ("on", "left_on", "right_on", "features", "categorical")


def _check_equivalent(
    name: str, spec: Join, given: Join, encoding: TableEncoding | None
) -> None:
    """Raise unless ``given`` joins as the schema's ``spec`` (fields left at their
    defaults are taken from the schema).

    Equivalent spellings are accepted: ``on="k"``, ``on=["k"]`` and
    ``left_on="k", right_on="k"``; the features in another order; a text column
    listed as categorical or left implicit (it was one-hot encoded either way).
    """
    default = Join(None)

    def differs(field: str, theirs: Any, mine: Any) -> ValueError:
        return ValueError(
            f"join {name!r}: {field}={theirs!r} differs from the schema's "
            f"{field}={mine!r}; with a schema, give the tables only (a dict of "
            "source name to table) or Joins equivalent to the training ones."
        )

    for f in _join_fields():
        if f in _CHECKS or f in _MEANING:
            continue
        mine, theirs = getattr(spec, f), getattr(given, f)
        if not (_same(mine, theirs) or _same(theirs, getattr(default, f))):
            raise differs(f, theirs, mine)
    if any(getattr(given, f) is not None for f in ("on", "left_on", "right_on")):
        try:
            keys = given.keys(name)
        except ValueError:
            keys = None
        if keys != spec.keys(name):
            shown = {
                f: getattr(given, f)
                for f in ("on", "left_on", "right_on")
                if getattr(given, f) is not None
            }
            theirs = ", ".join(f"{k}={v!r}" for k, v in shown.items())
            lk, rk = spec.keys(name)
            raise ValueError(
                f"join {name!r}: the keys ({theirs}) differ from the schema's "
                f"(left {lk} = right {rk}); with a schema, give the tables only (a "
                "dict of source name to table) or Joins equivalent to the training "
                "ones."
            )
    features = _as_list(given.features)
    if features and sorted(map(str, features)) != sorted(map(str, spec.features)):
        raise differs("features", given.features, spec.features)
    if encoding is None:
        return
    onehot = {c.column for c in encoding.columns if c.kind == "onehot"}
    # One-hot because of its dtype (text, categorical), not because listed.
    implicit = {
        c.column
        for c in encoding.columns
        if c.kind == "onehot" and not _numeric_dtype_name(c.dtype)
    }
    listed = set(_as_list(given.categorical))
    if not listed:
        return  # left unset: the schema's
    # A numeric column is one-hot only where listed: it must be listed again.
    if not listed <= onehot or not onehot - implicit <= listed:
        raise differs("categorical", given.categorical, spec.categorical)


def _numeric_dtype_name(name: str) -> bool:
    """Whether a training column's dtype (its name) is numeric or boolean."""
    try:
        dt = pd.api.types.pandas_dtype(name)
    except (TypeError, ValueError):
        return False
    return pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt)


def _same(a: Any, b: Any) -> bool:
    """Equal as specification values: lists equal tuples, 1 equals 1.0, not True."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, numbers.Real) and isinstance(b, numbers.Real):
        return float(a) == float(b)
    return a is b or (type(a) is type(b) and a == b)
