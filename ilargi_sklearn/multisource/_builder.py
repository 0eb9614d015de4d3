"""Building a MultiSourceDataset from DataFrames and join specifications.

Joins are computed on key columns and row ids only: each join yields an index vector
(target row -> row of the joined table), snowflake joins compose index vectors, and
feature columns are encoded once per source table, never repeated per target row.

Building *fits* an encoding (the categories that occur, the imputation values) and
records it, with the joins, as the dataset's :class:`DatasetSchema`; building with
that schema encodes new frames exactly like the training ones. Every join reports
how many rows it matched: a join that matches few rows is almost always a key
mistake, so it warns (and fails when no row matches) unless told otherwise.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from ilargi_sklearn.multisource._encoding import (
    HANDLE_UNKNOWN,
    Impute,
    TableEncoding,
    UnknownCategoryWarning,
    check_impute,
    derive_encoding,
    encode_table,
    is_categorical,
)
from ilargi_sklearn.multisource._keys import (
    hazard_rows,
    hazards_possible,
    int_float_precision,
    key_codes,
    key_hazards,
    key_kind,
    kinds_match,
    numbers_as_text,
    row_number_hints,
    time_zone,
)
from ilargi_sklearn.multisource._matrices import _from_matrices

__all__ = [
    "DEFAULT_MIN_MATCH",
    "Join",
    "JoinFanOutWarning",
    "JoinMatchWarning",
]

How = Literal["inner", "left", "outer"]

#: Joins matching fewer of their rows than this warn (:class:`JoinMatchWarning`).
#: Below one half, most rows take zeros for the table's features: either the keys
#: are wrong (the usual cause, and then the rate is near 0) or the table barely
#: informs the model; both are worth a look, and ``min_match`` silences it.
DEFAULT_MIN_MATCH = 0.5

#: The right key of a row-number join (``Join(row_number=...)``).
ROW_NUMBER = "<row number>"


#: ``Join(validate=...)``: pandas.merge's spellings, and the check each makes.
VALIDATE = {
    "one_to_one": "one_to_one",
    "1:1": "one_to_one",
    "one_to_many": "one_to_many",
    "1:m": "one_to_many",
    "many_to_one": "many_to_one",
    "m:1": "many_to_one",
    "many_to_many": "many_to_many",
    "m:m": "many_to_many",
}


class JoinMatchWarning(UserWarning):
    """A join matched fewer rows than its ``min_match``, or a known key mistake
    (padded or differently cased text, keys off by one) explains unmatched keys."""


class JoinFanOutWarning(UserWarning):
    """A join repeated rows: keys occur more than once in the joined table.

    Silenced by declaring the relationship: ``Join(validate="one_to_many")`` (or
    ``"many_to_many"``); ``validate="many_to_one"`` makes it an error.
    """


@dataclass(frozen=True)
class Join:
    """How one table joins the dataset.

    Parameters
    ----------
    table : pandas.DataFrame, polars.DataFrame or pyarrow.Table
        The table to join (never modified).
    on : str or list of str, optional
        Key column(s) with the same name on both sides.
    left_on, right_on : str or list of str, optional
        Key column(s) of the left table (the base, or ``via``) and of ``table``.
    features : list of str, default=()
        Columns of ``table`` that become features, in this order.
    how : {"inner", "left", "outer"}, default="left"
        Join type. Unmatched target rows of a left or outer join take zeros for
        this table's features.
    name : str, optional
        Source name used in feature names (``"{name}__{column}"``); default
        ``"join{i}"``.
    via : str, optional
        Name of an earlier join whose table is the left side (snowflake schemas);
        default the base table.
    categorical : list of str, optional
        Feature columns to one-hot encode even if numeric. Object, string and
        categorical dtypes are one-hot encoded automatically.
    impute : {"zero", "mean", "median", "joined_mean", "missing"} or float, optional
        Replacement for NaN in this table's numeric features; default: NaN raises a
        ``ValueError``. ``"mean"`` and ``"median"`` are computed over the table's
        own rows; ``"joined_mean"`` is the mean over the dataset's rows (a table row
        counts once per dataset row that takes it), which is what
        ``SimpleImputer`` computes on the joined table. ``"missing"`` keeps NaN as
        a missing value (a dataset that ``allows_nan``, for the estimators that
        route missing values, such as the gradient-boosted trees). For categorical
        features any imputation maps NaN to an all-zero one-hot row.
    indicator : bool, default=False
        Add a feature ``"{name}__matched"`` that is 1 on target rows this table
        matched and 0 elsewhere (useful with left joins).
    row_number : int, optional
        Join ``left_on`` against the table's row number instead of a key column:
        the first row has number ``row_number`` (1 for the 1-based foreign keys of
        many exported datasets, 0 for positions).
    nulls_equal : bool, default=False
        Whether a missing key (NaN, None, NaT) matches a missing key, as in
        ``pandas.merge``. By default missing keys match nothing, as in SQL.
    min_match : float, optional
        Warn (:class:`JoinMatchWarning`) when fewer than this fraction of the rows
        find a partner; a join that matches no row raises unless ``min_match=0``.
        Default: ``from_frames``' ``min_match``. Whatever the rate, unmatched keys
        that a known key mistake explains (text that differs by whitespace,
        quotes, case or leading zeros, numbers against text, row numbers off by
        one) warn.
    validate : {"one_to_one", "one_to_many", "many_to_one", "many_to_many"}, optional
        The relationship, checked as ``pandas.merge(validate=...)`` does (also
        ``"1:1"``, ``"1:m"``, ``"m:1"``, ``"m:m"``): "one_to_one" and
        "one_to_many" need unique keys in the left table (the base, or ``via``),
        "one_to_one" and "many_to_one" unique keys in ``table``; a violation
        raises ``pandas.errors.MergeError`` (a ``ValueError``) naming a few
        repeated keys. Missing keys match nothing and are not counted unless
        ``nulls_equal``. Default: a join that repeats rows (a key occurs more than
        once in ``table``) warns (:class:`JoinFanOutWarning`); "one_to_many" or
        "many_to_many" declares that intended.
    """

    table: Any
    on: str | Sequence[str] | None = None
    left_on: str | Sequence[str] | None = None
    right_on: str | Sequence[str] | None = None
    features: Sequence[str] = ()
    how: How = "left"
    name: str | None = None
    via: str | None = None
    categorical: Sequence[str] = field(default_factory=tuple)
    impute: Impute = None
    indicator: bool = False
    row_number: int | None = None
    nulls_equal: bool = False
    min_match: float | None = None
    validate: str | None = None

    def keys(self, label: str) -> tuple[list[str], list[str]]:
        """The left and right key columns (:data:`ROW_NUMBER` for a row number)."""
        if self.row_number is not None:
            if self.on is not None or self.right_on is not None:
                raise ValueError(
                    f"join {label!r}: row_number joins left_on against the table's "
                    "row number; give left_on only (no on or right_on)."
                )
            if self.left_on is None:
                raise ValueError(f"join {label!r}: row_number needs left_on.")
            lk = _as_list(self.left_on)
            if len(lk) != 1:
                raise ValueError(
                    f"join {label!r}: a row-number join takes one left_on column, "
                    f"got {lk}."
                )
            return lk, [ROW_NUMBER]
        if self.on is not None:
            if self.left_on is not None or self.right_on is not None:
                raise ValueError(
                    f"join {label!r}: give either on or left_on/right_on, not both."
                )
            return _as_list(self.on), _as_list(self.on)
        if self.left_on is None or self.right_on is None:
            raise ValueError(
                f"join {label!r}: give on, or both left_on and right_on (or left_on "
                "and row_number)."
            )
        lk, rk = _as_list(self.left_on), _as_list(self.right_on)
        if len(lk) != len(rk) or not lk:
            raise ValueError(
                f"join {label!r}: left_on {lk} and right_on {rk} must have the same length."
            )
        return lk, rk

    def spec(self) -> Join:
        """This join without its table (what a schema keeps)."""
        return replace(self, table=None)


def _as_list(v: Any) -> list[Any]:
    """A column list; a single label (a string, or a number as ``on=0``) is one
    column, not its characters; a list or tuple lists columns."""
    if v is None:
        return []
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
        return [v]
    return list(v)


def _as_frame(
    frame: Any, what: str, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """A pandas DataFrame for a pandas, polars or pyarrow table.

    A pandas frame is used as it is (its index is what ``align`` checks values
    against); another library's table is converted, only ``columns`` of it.
    """
    if isinstance(frame, pd.DataFrame):
        return frame
    from ilargi_sklearn.multisource._interop import as_pandas

    return as_pandas(frame, what, columns)


def _needed_columns(schema: Any, target: str | None) -> dict[str, list[str]]:
    """The columns of each table (by source name) that building reads."""
    need = {schema.base_name: [*schema.base_features, *([target] if target else [])]}
    for i, j in enumerate(schema.joins):
        label = j.name if j.name is not None else f"join{i}"
        lk, rk = j.keys(label)
        left = j.via if j.via is not None else schema.base_name
        need.setdefault(left, []).extend(lk)
        need[label] = need.get(label, []) + [
            *(k for k in rk if k != ROW_NUMBER),
            *_as_list(j.features),
        ]
    return {k: list(dict.fromkeys(v)) for k, v in need.items()}


def _check_columns(
    frame: pd.DataFrame, cols: Sequence[str], what: str, label: str
) -> None:
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{what} {missing} not found in table {label!r}; its columns are "
            f"{list(frame.columns)}."
        )
    if not frame.columns.is_unique:
        repeated = set(frame.columns[frame.columns.duplicated()])
        twice = list(dict.fromkeys(c for c in cols if c in repeated))
        if twice:
            raise ValueError(
                f"table {label!r} has several columns named {twice} ({what}): "
                "rename them first (pandas.merge refuses them too), e.g. "
                "frame.columns = [...]."
            )


def _check_table_spec(
    frame: pd.DataFrame,
    features: list[str],
    forced: list[str],
    impute: Any,
    label: str,
    impute_arg: str,
) -> None:
    """Validate one table's feature list, categorical list and imputation."""
    _check_columns(frame, features, "features", label)
    seen: set[str] = set()
    repeated = [c for c in features if c in seen or seen.add(c)]
    if repeated:
        raise ValueError(f"features of table {label!r} list {repeated} more than once.")
    stray = [c for c in forced if c not in features]
    if stray:
        raise ValueError(
            f"categorical columns {stray} of table {label!r} are not among its "
            f"features {features}; add them to the features or drop them."
        )
    check_impute(impute, label, impute_arg)


def _check_fraction(value: Any, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 <= value <= 1
    ):
        raise ValueError(f"{what} must be a fraction in [0, 1], got {value!r}.")
    return float(value)


def _expand(
    counts: np.ndarray, starts: np.ndarray, keep_empty: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Repeat each target row by its number of matches.

    Returns the old target row and the position into the sorted match list of each new
    target row (-1 where a row had no match and ``keep_empty`` keeps it).
    """
    eff = np.maximum(counts, 1) if keep_empty else counts
    old = np.repeat(np.arange(counts.shape[0]), eff)
    first = np.repeat(np.cumsum(eff) - eff, eff)
    within = np.arange(old.shape[0]) - first
    pos = np.repeat(starts, eff) + within
    pos[np.repeat(counts == 0, eff)] = -1
    return old, pos


def _key_frame(R: pd.DataFrame, j: Join) -> pd.DataFrame:
    """The frame holding the right keys: the table, or its row numbers."""
    if j.row_number is None:
        return R
    return pd.DataFrame({ROW_NUMBER: np.arange(len(R), dtype=np.int64) + j.row_number})


def _check_join(
    i: int,
    j: Any,
    tables: dict[str, Any],
    base_name: str,
    hows: tuple[str, ...],
    kind_of: Any = None,
    why: str = "",
    columns: dict[str, list[str]] | None = None,
) -> tuple:
    """Check join ``i`` of a ``from_frames`` call against the tables seen so far.

    Returns ``(label, table, left_name, left_table, left_keys, right_keys,
    features, categorical)``; the table is converted to pandas (only its
    ``columns[label]`` when it comes from another library). ``hows`` lists the
    join types the caller supports; ``kind_of(table_name, column)`` gives a left key
    column for the dtype check (default: the column itself); ``why`` explains a
    refused join type.
    """
    if not isinstance(j, Join):
        raise TypeError(f"joins[{i}] must be a Join, got {type(j).__name__}.")
    label = j.name if j.name is not None else f"join{i}"
    if label in tables:
        raise ValueError(
            f"duplicate source name {label!r}; give each Join a distinct name."
        )
    if j.how not in hows:
        names = [repr(h) for h in hows]
        allowed = names[0] if len(names) == 1 else ", ".join(names[:-1])
        allowed += "" if len(names) == 1 else f" or {names[-1]}"
        raise ValueError(
            f"join {label!r}: how must be {allowed}, got {j.how!r}"
            + (f" ({why})." if why else ".")
        )
    R = _as_frame(j.table, f"join {label!r}: table", (columns or {}).get(label))
    if len(R) == 0:
        raise ValueError(f"table {label!r} is empty.")
    left_name = j.via if j.via is not None else base_name
    if left_name not in tables:
        raise ValueError(
            f"join {label!r}: via={j.via!r} names no earlier table; known: "
            f"{list(tables)}."
        )
    if j.min_match is not None:
        _check_fraction(j.min_match, f"join {label!r}: min_match")
    if j.row_number is not None and (
        isinstance(j.row_number, bool) or not isinstance(j.row_number, numbers.Integral)
    ):
        raise ValueError(
            f"join {label!r}: row_number must be an integer (the number of the first "
            f"row, usually 1 or 0), got {j.row_number!r}."
        )
    L = tables[left_name]
    lk, rk = j.keys(label)
    _check_columns(L, lk, "key columns", left_name)
    Rk = _key_frame(R, j)
    _check_columns(Rk, rk, "key columns", label)
    features, forced = _as_list(j.features), _as_list(j.categorical)
    _check_table_spec(R, features, forced, j.impute, label, "impute")
    if j.validate is not None and j.validate not in VALIDATE:
        raise ValueError(
            f"join {label!r}: validate must be one of {list(VALIDATE)}, got "
            f"{j.validate!r}."
        )
    for a, b in zip(lk, rk):
        left_col = L[a] if kind_of is None else kind_of(left_name, a)
        ka, kb = key_kind(left_col), key_kind(Rk[b])
        if not kinds_match(ka, kb):
            raise TypeError(_dtype_mismatch(label, left_name, a, left_col, Rk[b], b))
        tz_a, tz_b = time_zone(left_col), time_zone(Rk[b])
        if ka == kb == "datetime" and (tz_a is None) != (tz_b is None):
            raise TypeError(
                f"join {label!r}: key {left_name}.{a} ({left_col.dtype}) and "
                f"{label}.{b} ({Rk[b].dtype}) are datetimes with and without a time "
                "zone, which never compare equal (pandas.merge refuses them too): "
                "give both the same zone, e.g. frame[col].dt.tz_localize('UTC') on "
                "the naive one."
            )
        lossy = int_float_precision(
            left_col, Rk[b], (f"{left_name}.{a}", f"{label}.{b}")
        )
        if lossy is not None:
            warnings.warn(f"join {label!r}: {lossy}", JoinMatchWarning, stacklevel=5)
    return label, R, left_name, L, lk, rk, features, forced


def _dtype_mismatch(
    label: str, left: str, a: str, la: pd.Series, rb: pd.Series, b: str
) -> str:
    where_b = "its row number" if b == ROW_NUMBER else f"{label}.{b} ({rb.dtype})"
    msg = (
        f"join {label!r}: key {left}.{a} ({la.dtype}) and {where_b} have "
        "incompatible dtypes"
    )
    for name, col, s in ((f"{left}.{a}", a, la), (f"{label}.{b}", b, rb)):
        if key_kind(s) == "string" and (examples := numbers_as_text(s)):
            return (
                f"{msg}: {name} holds numbers stored as text (e.g. {examples}); "
                f"convert it first, e.g. frame[{col!r}] = pd.to_numeric(frame[{col!r}])."
            )
    return f"{msg}; cast one side first, e.g. frame[{a!r}].astype(...)."


# ----------------------------------------------------------------- joining
@dataclass
class _JoinResult:
    """Index vectors of every table and the match report of every join."""

    tables: dict[str, pd.DataFrame]
    idx: dict[str, np.ndarray]
    in_order: set[str]
    report: list[dict[str, Any]]
    labels: list[str]


def _join_all(
    base_name: str,
    base: pd.DataFrame,
    joins: Sequence[Join],
    min_match: float,
    expected: Sequence[float] = (),
    columns: dict[str, list[str]] | None = None,
) -> _JoinResult:
    tables: dict[str, pd.DataFrame] = {base_name: base}
    n_rows = len(base)
    idx: dict[str, np.ndarray] = {base_name: np.arange(n_rows, dtype=np.int64)}
    # Tables whose rows are still the target rows in order (idx is arange): a join
    # on them needs no gather through idx.
    in_order = {base_name}
    report: list[dict[str, Any]] = []
    labels: list[str] = []
    emptied_by: str | None = None

    for i, j in enumerate(joins):
        label, R, left_name, L, lk, rk, _, _ = _check_join(
            i, j, tables, base_name, ("inner", "left", "outer"), columns=columns
        )
        Rk = _key_frame(R, j)
        left_codes, right_codes, n_codes = key_codes(L, lk, Rk, rk, j.nulls_equal)
        # Shifted by one so that missing keys (code -1) fall into bin 0.
        per_code = np.bincount(right_codes + 1, minlength=n_codes + 1)[1:]
        rule = VALIDATE.get(j.validate) if j.validate is not None else None
        if rule is not None:
            _check_validate(
                rule,
                j.validate,
                (left_name, L, lk, left_codes),
                (label, Rk, rk, right_codes),
                per_code,
                n_codes,
            )
        left_rows = idx[left_name]
        ordered = left_name in in_order
        valid = None if ordered else left_rows >= 0
        repeats: tuple[np.ndarray, np.ndarray, int, str] | None = None
        if per_code.max(initial=0) <= 1:
            # The last entry is the sentinel that missing left keys read.
            row_of_code = np.full(n_codes + 1, -1, dtype=np.int64)
            row_of_code[right_codes] = np.arange(len(R), dtype=np.int64)
            row_of_code[-1] = -1
            pos_l = row_of_code[left_codes]
            if ordered:
                pos = pos_l
            else:
                pos = np.where(valid, pos_l[np.maximum(left_rows, 0)], -1)
            del pos_l, row_of_code  # n-length temporaries: free before the next join
            hit = pos >= 0
            stats = _match_stats(
                label, j, left_name, lk, rk, L, Rk, left_rows, valid, hit, left_codes
            )
            # Each key occurs once in the table: its key column is its distinct keys.
            stats["_right_unique"] = len(rk) == 1
            if j.how == "inner":
                if not hit.all():
                    idx = {k: v[hit] for k, v in idx.items()}
                    in_order.clear()
                    pos = pos[hit]
        else:
            # One-to-many: the right rows sorted by key code (stable, so matches keep
            # the right table's order; rows with a missing key sort first and are
            # skipped); a left row's matches are one run of them.
            n_null = int((right_codes < 0).sum())
            right_rows = np.argsort(right_codes, kind="stable")[n_null:]
            starts_code = np.cumsum(per_code) - per_code
            per_left = np.append(per_code, 0)[left_codes]
            starts_l = np.append(starts_code, 0)[left_codes]
            if ordered:
                counts, starts = per_left, starts_l
            else:
                counts = np.where(valid, per_left[np.maximum(left_rows, 0)], 0)
                starts = np.where(valid, starts_l[np.maximum(left_rows, 0)], 0)
            stats = _match_stats(
                label,
                j,
                left_name,
                lk,
                rk,
                L,
                Rk,
                left_rows,
                valid,
                counts > 0,
                left_codes,
            )
            old, p = _expand(counts, starts, keep_empty=j.how != "inner")
            pos = np.full(p.shape[0], -1, dtype=np.int64)
            pos[p >= 0] = right_rows[p[p >= 0]]
            repeated = np.flatnonzero(counts > 1)
            if repeated.size:
                rows_l = repeated if ordered else left_rows[repeated]
                stats["fan_out"] = float(counts.sum() / max(stats["matched"], 1))
                stats["repeated_keys"] = _key_examples(L, lk, rows_l[:200])
                n_keys = np.unique(left_codes[rows_l]).shape[0]
                # Which relationship to suggest declaring: pandas' one_to_many
                # needs unique keys on the left.
                per_left = np.bincount(left_codes + 1, minlength=n_codes + 1)[1:]
                declare = "one_to_many" if per_left.max() <= 1 else "many_to_many"
                repeats = (counts, repeated, n_keys, declare)
            idx = {k: v[old] for k, v in idx.items()}
            in_order.clear()
        del left_codes, right_codes
        if j.how == "outer":
            unmatched = np.setdiff1d(np.arange(len(R)), pos[pos >= 0])
            if unmatched.size:
                pad = np.full(unmatched.size, -1, dtype=np.int64)
                idx = {k: np.concatenate([v, pad]) for k, v in idx.items()}
                in_order.clear()
                pos = np.concatenate([pos, unmatched])
        idx[label] = pos.astype(np.int64, copy=False)
        tables[label] = R
        labels.append(label)
        stats["rows_out"] = int(pos.shape[0])
        report.append(stats)
        _check_match(
            stats,
            j.min_match if j.min_match is not None else min_match,
            expected[i] if expected else None,
        )
        if repeats is not None and rule not in ("one_to_many", "many_to_many"):
            _warn_fan_out(stats, left_name, *repeats)
        if pos.shape[0] == 0 and n_rows > 0 and emptied_by is None:
            emptied_by = f"inner join {label!r} matched no row of {left_name!r}"
        n_rows = pos.shape[0]

    if n_rows == 0:
        raise ValueError(
            f"the joins leave no target rows: {emptied_by or 'no join matched'}; check "
            "the key columns and their values, or use how='left'."
        )
    return _JoinResult(tables, idx, in_order, report, labels)


def _key_examples(frame: pd.DataFrame, cols: list[Any], rows: np.ndarray) -> list:
    """A few distinct key values (tuples for composite keys) of ``frame``'s rows."""
    columns = [frame[c].iloc[rows].tolist() for c in cols]
    # By their text: NaN differs from NaN, but one example of it is enough.
    examples = {
        repr(k): k for k in (v[0] if len(cols) == 1 else v for v in zip(*columns))
    }
    return list(examples.values())[:5]


def _check_validate(
    rule: str,
    given: str,
    left: tuple[str, pd.DataFrame, list[Any], np.ndarray],
    right: tuple[str, pd.DataFrame, list[Any], np.ndarray],
    per_code: np.ndarray,
    n_codes: int,
) -> None:
    """Raise ``MergeError`` where ``Join(validate=...)``'s keys are not unique.

    As ``pandas.merge(validate=...)``, on the two tables: the left table's own
    rows (the base, or the ``via`` table) and ``table``'s. Missing keys (code -1)
    match nothing and are not counted.
    """
    left_name, label = left[0], right[0]
    sides = []
    if rule in ("one_to_one", "one_to_many"):
        per_left = np.bincount(left[3] + 1, minlength=n_codes + 1)[1:]
        sides.append((*left, per_left, "many_to_one"))
    if rule in ("one_to_one", "many_to_one"):
        sides.append((*right, per_code, "one_to_many"))
    for name, frame, cols, codes, per, other in sides:
        if per.max(initial=0) <= 1:
            continue
        dup = per > 1
        # -1 (a missing key) reads the appended False.
        rows = np.flatnonzero(np.append(dup, False)[codes])
        examples = _key_examples(frame, cols, rows[:200])
        cols_text = cols[0] if len(cols) == 1 else cols
        side = "left" if name == left_name else "right"
        raise pd.errors.MergeError(
            f"join {label!r}: validate={given!r} needs unique keys in table "
            f"{name!r} (the {side} side), but {_keys_occur(int(dup.sum()))} more "
            f"than once there, e.g. {examples}: deduplicate it (e.g. "
            f"frame.drop_duplicates(subset={cols_text!r})), or declare the "
            f"relationship it has (validate={other!r} or 'many_to_many')."
        )


def _keys_occur(n: int) -> str:
    return f"{n:,} key occurs" if n == 1 else f"{n:,} keys occur"


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def _warn_fan_out(
    stats: dict[str, Any],
    left_name: str,
    counts: np.ndarray,
    repeated: np.ndarray,
    n_keys: int,
    declare: str,
) -> None:
    label = stats["join"]
    added = int(counts[repeated].sum()) - repeated.shape[0]
    warnings.warn(
        f"join {label!r} ({stats['how']}, {stats['on']}) repeats rows: "
        f"{_keys_occur(n_keys)} more than once in table {label!r} (e.g. "
        f"{stats['repeated_keys']}), so {_rows(repeated.shape[0])} match several of "
        f"its rows and the join adds {_rows(added)} "
        f"({counts.shape[0]:,} rows in, {stats['rows_out']:,} out). If each "
        f"{left_name} row should take one row of it, deduplicate the table "
        "(validate='many_to_one' makes this an error); if the repeats are intended, "
        f"declare them with validate={declare!r}. A target or weights per base "
        "row follow the dataset's rows with ds.align(y).",
        JoinFanOutWarning,
        stacklevel=5,
    )


def _match_stats(
    label: str,
    j: Join,
    left_name: str,
    lk: list[str],
    rk: list[str],
    L: pd.DataFrame,
    Rk: pd.DataFrame,
    left_rows: np.ndarray,
    valid: np.ndarray | None,
    hit: np.ndarray,
    left_codes: np.ndarray,
) -> dict[str, Any]:
    """One join's line of the match report (before rows are dropped or repeated)."""
    rows = hit.shape[0] if valid is None else int(valid.sum())
    matched = int(hit.sum())
    on = " AND ".join(
        f"{left_name}.{a} = {label}.{'row number' if b == ROW_NUMBER else b}"
        for a, b in zip(lk, rk)
    )
    stats: dict[str, Any] = {
        "join": label,
        "how": j.how,
        "on": on,
        "rows": rows,
        "matched": matched,
        "fraction": matched / rows if rows else 1.0,
        "null_keys": 0,
        "unmatched_keys": [],
        "hazards": [],
        "rows_out": rows,
        "fan_out": 1.0,
        "repeated_keys": [],
    }
    if matched < rows:
        miss = ~hit if valid is None else valid & ~hit
        target_rows = np.flatnonzero(miss)
        left = target_rows if valid is None else left_rows[target_rows]
        null = left_codes[left] < 0
        stats["null_keys"] = int(null.sum())
        left = left[~null]
        # The examples and one row per unmatched key for the hazard checks
        # (_check_match), taken from the key columns at once (a take from an
        # Arrow column costs about a millisecond, however few rows).
        head = left[:200]
        sample = (
            hazard_rows(left, left_codes)
            if hazards_possible(L, lk, Rk, rk)
            else left[:0]
        )
        # Positions on both axes: L[lk] would copy whole key columns first.
        picked = L.iloc[np.concatenate([head, sample]), L.columns.get_indexer(lk)]
        stats["unmatched_keys"] = _key_examples(picked, lk, np.arange(head.shape[0]))
        if left.size:
            stats["_hazard_args"] = (
                picked.iloc[head.shape[0] :],
                lk,
                Rk,
                rk,
                np.arange(sample.shape[0]),
                (left_name, label),
            )
            stats["_row_number"] = (j.row_number, L[lk[0]])
    return stats


#: With a schema, a batch's match rate is flagged only when it is this unlikely
#: under the training rate (a few new rows may all miss a join by chance).
_IMPLAUSIBLE = 1e-3


def _plausible(matched: int, rows: int, expected: float) -> bool:
    """Whether ``matched`` of ``rows`` is a likely draw at the training rate.

    Chernoff's bound on the binomial tail, ``P(X <= k) <= exp(-n KL(k/n || p))``,
    exact for ``k = 0``; the training rate is capped at 0.99 so that one unmatched
    new row after a fully matched training set is not flagged by itself.
    """
    p, q = min(expected, 0.99), matched / rows
    if q >= p:
        return True
    kl = (q * np.log(q / p) if q > 0 else 0.0) + (1 - q) * np.log((1 - q) / (1 - p))
    return rows * kl < -np.log(_IMPLAUSIBLE)


def _check_match(
    stats: dict[str, Any], min_match: float, expected: float | None = None
) -> None:
    """Warn when a join matched fewer rows than ``min_match`` (fail at none), or
    when a known key mistake explains some unmatched keys.

    ``expected`` is the join's match rate in training (building with a schema):
    then only a rate that is also implausibly low for it is flagged. The hazard
    checks look at a bounded sample of the unmatched keys, whatever the rate.
    """
    args = stats.pop("_hazard_args", None)
    row_number, left_keys = stats.pop("_row_number", (None, None))
    right_unique = stats.pop("_right_unique", False)
    if stats["rows"] == 0:
        return
    low = min_match > 0 and stats["fraction"] < min_match
    if low and expected is not None:
        low = not _plausible(stats["matched"], stats["rows"], expected)
    if args is not None:
        _, lk, Rk, rk, _, (left_name, label) = args
        # A key column that never matches is a hazard only when most rows miss:
        # otherwise its unmatched values are just absent from the table.
        stats["hazards"] = key_hazards(
            *args, partial=not low, right_unique=right_unique
        )
        # Keys that span 1..len(table) hint at row numbers only when they barely
        # match: a key join that mostly matches has keys of its own.
        if len(lk) == 1 and (row_number is not None or low):
            stats["hazards"] += row_number_hints(
                left_keys, len(Rk), row_number, f"{left_name}.{lk[0]}", label
            )
    if not low and not stats["hazards"]:
        return
    frac = format_fraction(stats["fraction"])
    trained = (
        "" if expected is None else f", against {format_fraction(expected)} in training"
    )
    parts = [
        f"join {stats['join']!r} ({stats['how']}, {stats['on']}) matched "
        f"{stats['matched']:,} of {stats['rows']:,} rows ({frac}{trained})"
    ]
    if stats["unmatched_keys"]:
        parts.append(f"unmatched keys include {stats['unmatched_keys']}")
    if stats["null_keys"]:
        parts.append(
            f"{stats['null_keys']:,} rows have a missing key, which matches nothing "
            "(nulls_equal=True matches missing keys as pandas.merge does)"
        )
    msg = "; ".join(parts) + "."
    if stats["hazards"]:
        msg += " " + " ".join(h[:1].upper() + h[1:] for h in stats["hazards"])
    if not low:
        lost = (
            "Unmatched rows are dropped (inner join)"
            if stats["how"] == "inner"
            else "Unmatched rows take zeros for this table's features"
        )
        warnings.warn(
            msg + f" {lost}: fix the keys (the rate is above min_match, so this is "
            "only a warning).",
            JoinMatchWarning,
            stacklevel=5,
        )
        return
    if stats["matched"] == 0:
        raise ValueError(
            msg + " No row matched: the keys are probably wrong. If this is "
            "intended, pass min_match=0 (on the Join or to from_frames)."
        )
    warnings.warn(
        msg + f" This is below min_match={min_match:g}: check the keys, or pass a "
        "lower min_match (on the Join or to from_frames) if the rate is expected.",
        JoinMatchWarning,
        stacklevel=5,
    )


def format_fraction(f: float) -> str:
    """A fraction as a percentage with the digits it needs: 99.999% is not 100%."""
    if f in (0.0, 1.0):
        return f"{100 * f:.0f}%"
    for digits in range(1, 10):
        text = f"{100 * f:.{digits}f}"
        if float(text) not in (0.0, 100.0):
            return text + "%"
    return f"{100 * f:.3g}%"


# ----------------------------------------------------------------- building
def build(
    schema: Any,
    base: Any,
    tables: Sequence[Any],
    *,
    target: str | None,
    handle_unknown: str,
    min_match: float,
    checks: Sequence[Join] | None = None,
) -> Any:
    """Build a dataset from the frames of ``schema``'s tables (in join order).

    A schema without encodings fits them (a new dataset); one with encodings
    applies them (new data encoded like the training data). ``checks``: Joins
    whose ``min_match`` and ``validate``, where set, replace the schema's.
    """
    from ilargi_sklearn.multisource._multi_source import MultiSourceDataset

    if handle_unknown not in HANDLE_UNKNOWN:
        raise ValueError(
            f"handle_unknown must be one of {list(HANDLE_UNKNOWN)}, got "
            f"{handle_unknown!r}."
        )
    min_match = _check_fraction(min_match, "min_match")
    fitted = bool(schema.encodings)
    dtype = np.dtype(schema.dtype)
    base_name = schema.base_name
    columns = _needed_columns(schema, target)
    base = _as_frame(base, "base", columns[base_name])
    if len(base) == 0:
        raise ValueError(f"table {base_name!r} is empty.")
    base_features = list(schema.base_features)
    base_categorical = list(schema.base_categorical)
    _check_table_spec(
        base,
        base_features,
        base_categorical,
        schema.base_impute,
        base_name,
        "base_impute",
    )
    if target is not None:
        _check_columns(base, [target], "target column", base_name)
    joins = [replace(j, table=t) for j, t in zip(schema.joins, tables)]
    for i, c in enumerate(checks or ()):
        joins[i] = replace(
            joins[i],
            min_match=joins[i].min_match if c.min_match is None else c.min_match,
            validate=joins[i].validate if c.validate is None else c.validate,
        )
    res = _join_all(base_name, base, joins, min_match, schema.match_rates, columns)

    specs: dict[str, tuple[list[str], list[str], Impute, bool, str]] = {
        base_name: (
            base_features,
            base_categorical,
            schema.base_impute,
            False,
            "base_impute=...",
        )
    }
    for j, label in zip(joins, res.labels):
        specs[label] = (
            _as_list(j.features),
            _as_list(j.categorical),
            j.impute,
            j.indicator,
            "impute=... on its Join",
        )
    order = list(res.tables)
    coalesce = set(schema.coalesce)
    for col in sorted(coalesce):
        holders = [name for name in order if col in specs[name][0]]
        if not holders:
            raise ValueError(
                f"coalesce names {col!r}, which no table lists among its features."
            )
        for name in holders:
            if is_categorical(res.tables[name][col], specs[name][1]):
                raise ValueError(
                    f"coalesce: column {col!r} of table {name!r} is categorical; only "
                    "numeric columns can be coalesced."
                )
    prio = list(schema.priority) if schema.priority is not None else order
    unknown_names = [p for p in prio if p not in res.tables]
    if unknown_names:
        raise ValueError(
            f"priority names unknown sources {unknown_names}; known: {order}."
        )
    prio_idx = {
        name: r for r, name in enumerate(prio + [o for o in order if o not in prio])
    }

    encodings = dict((e.name, e) for e in schema.encodings)
    fitted_encodings: list[TableEncoding] = []
    unknown: dict[str, tuple[int, list[Any], Any]] = {}
    sources, indicators, mappings, source_names = [], [], [], []
    feature_names: list[str] = []
    target_of: dict[str, int] = {}
    shared_owner: dict[str, str] = {}
    for name in order:
        for col in specs[name][0]:
            if col in coalesce and (
                col not in shared_owner or prio_idx[name] < prio_idx[shared_owner[col]]
            ):
                shared_owner[col] = name
    for name in order:
        feats, forced, impute, indicator, hint = specs[name]
        frame, rows = res.tables[name], res.idx[name]
        identity = name in res.in_order or (
            rows.shape[0] == len(frame) and np.array_equal(rows, np.arange(len(frame)))
        )
        # Dataset rows per table row; shifted so that -1 (no match) falls in bin 0.
        counts = (
            None if identity else np.bincount(rows + 1, minlength=len(frame) + 1)[1:]
        )
        if fitted:
            enc = encodings[name]
            codes_of = None
            if counts is not None and 2 * np.count_nonzero(counts) < len(frame):
                # New data takes few rows of a table (a small batch against the
                # dimension tables): encode only those.
                keep = np.flatnonzero(counts)
                remap = np.full(len(frame) + 1, -1, dtype=np.int64)
                remap[keep] = np.arange(keep.shape[0])
                rows = remap[rows]  # -1 reads the sentinel
                frame = frame[[c.column for c in enc.columns]].iloc[keep]
                counts = None
        else:
            enc, codes_of = derive_encoding(
                frame, feats, forced, impute, indicator, name, counts, hint
            )
        fitted_encodings.append(enc)
        S, unseen = encode_table(
            frame,
            enc,
            dtype,
            schema.sparse,
            used=None if counts is None else counts > 0,
            codes_of=codes_of,
            impute_hint=hint,
        )
        unknown.update({f"{name}.{col}": v for col, v in unseen.items()})
        names, origins = enc.feature_names, enc.origins
        if S is None or S.shape[1] == 0:
            continue
        cm = np.empty(len(names), dtype=np.int64)
        for c, (fname, col) in enumerate(zip(names, origins)):
            if col is not None and col in coalesce:
                key = f"__shared__{col}"
                if key not in target_of:
                    target_of[key] = len(feature_names)
                    feature_names.append(f"{shared_owner[col]}__{col}")
                cm[c] = target_of[key]
            else:
                cm[c] = len(feature_names)
                feature_names.append(fname)
        sources.append(S)
        indicators.append(None if identity else rows)
        mappings.append(cm)
        source_names.append(name)
    if unknown:
        _report_unknown(unknown, handle_unknown)
    if not sources:
        raise ValueError(
            "no features selected: give base_features or Join(features=...) (a "
            "categorical column whose values all are missing encodes to no columns)."
        )
    if fitted and tuple(feature_names) != schema.feature_names:
        raise ValueError(  # pragma: no cover - the encodings fix the names
            "the frames encode to other features than the schema's; rebuild the "
            "schema from the training frames."
        )
    src_prio = sorted(range(len(source_names)), key=lambda k: prio_idx[source_names[k]])
    ds = _from_matrices(
        MultiSourceDataset,
        sources,
        indicators,
        mappings,
        feature_names,
        source_names=source_names,
        priority=src_prio,
        dtype=dtype,
        copy_indicators=False,  # the index vectors are the builder's own
        allow_nan=any(spec[2] == "missing" for spec in specs.values()),
    )
    if not fitted:
        schema = replace(
            schema,
            encodings=tuple(fitted_encodings),
            feature_names=tuple(feature_names),
            match_rates=tuple(float(r["fraction"]) for r in res.report),
        )
    ds.categories_ = {k: v for e in schema.encodings for k, v in e.categories.items()}
    ds._base_source = (
        source_names.index(base_name) if base_name in source_names else None
    )
    ds.schema_ = schema
    ds._match_report = res.report
    ds._set_origin(
        None if base_name in res.in_order else res.idx[base_name], len(base), base.index
    )
    if target is None:
        return ds
    # Rows an outer join added have no base row and so no target, as in pandas.
    return ds, ds.align(base[target], fill_value=np.nan)


def _report_unknown(unknown: dict[str, tuple[int, list[Any], Any]], how: str) -> None:
    if how == "ignore":
        return
    listed = "; ".join(
        f"{col} ({n:,} rows, e.g. {values}"
        + (f"; the column was {dt[0]} in training and is {dt[1]} now" if dt else "")
        + ")"
        for col, (n, values, dt) in unknown.items()
    )
    if how == "error":
        raise ValueError(
            f"categories the training data did not have: {listed}. Pass "
            "handle_unknown='warn' or 'ignore' to encode them as all-zero rows."
        )
    warnings.warn(
        f"categories the training data did not have are encoded as all zeros: "
        f"{listed}. Pass handle_unknown='ignore' to silence this, or 'error' to "
        "raise.",
        UnknownCategoryWarning,
        stacklevel=4,
    )


def _join_fields() -> list[str]:
    """The fields of a Join that a schema compares (all but the table)."""
    return [f.name for f in fields(Join) if f.name != "table"]
