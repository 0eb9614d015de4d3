"""Encoding one table's feature columns: numbers as floats, categories as one-hot.

Building a dataset from frames *fits* an encoding per table (:func:`derive_encoding`:
the categories that occur in the dataset's rows, sorted, and the imputation values)
and *applies* it (:func:`encode_table`). A dataset's schema keeps the fitted
encodings, so that new frames are encoded exactly like the training ones: the same
columns in the same order, unknown categories as all-zero rows (as
``OneHotEncoder(handle_unknown=...)`` does) and the training imputation values.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import scipy.sparse as sp

__all__ = [
    "ColumnEncoding",
    "TableEncoding",
    "UnknownCategoryWarning",
    "derive_encoding",
    "encode_table",
    "is_categorical",
]

Impute = Literal["zero", "mean", "median", "joined_mean", "missing"] | float | None
HandleUnknown = Literal["warn", "ignore", "error"]
IMPUTE_NAMES = ("zero", "mean", "median", "joined_mean", "missing")
HANDLE_UNKNOWN = ("warn", "ignore", "error")

#: Values from which a table's float features are copied as one block
#: (:func:`_float_block`): below it, writing column by column into a C-ordered
#: matrix is faster while the matrix stays in the cache (benchmarks/README.md).
_BLOCK_COPY_MIN = 2_000_000


class UnknownCategoryWarning(UserWarning):
    """Categories that the training data did not have were encoded as all zeros."""


@dataclass(frozen=True)
class ColumnEncoding:
    """How one feature column is encoded.

    Attributes
    ----------
    column : str
        The column of the table.
    kind : {"numeric", "onehot"}
        A float column, or one 0/1 column per category.
    categories : tuple
        The categories of a one-hot column, in the order of its columns.
    impute : {"zero", "mean", "median", "joined_mean", "missing"}, float or None
        The imputation asked for (None: a missing value is an error).
    fill : float or None
        The value that replaces a missing number (None without imputation, and
        for ``"missing"``, which keeps NaN). A missing category is an all-zero
        row when ``impute`` is set.
    dtype : str
        The column's dtype in the training frame (to explain a mismatch).
    """

    column: str
    kind: Literal["numeric", "onehot"]
    categories: tuple[Any, ...] = ()
    impute: Impute = None
    fill: float | None = None
    dtype: str = ""


@dataclass(frozen=True)
class TableEncoding:
    """The encoding of one table's features (see :class:`ColumnEncoding`).

    Attributes
    ----------
    name : str
        The source name (the prefix of the feature names).
    columns : tuple of ColumnEncoding
        The feature columns in order.
    indicator : bool
        Whether a ``"{name}__matched"`` column of ones follows them.
    """

    name: str
    columns: tuple[ColumnEncoding, ...]
    indicator: bool = False

    @property
    def feature_names(self) -> list[str]:
        names: list[str] = []
        for c in self.columns:
            if c.kind == "onehot":
                names += [f"{self.name}__{c.column}_{v}" for v in c.categories]
            else:
                names.append(f"{self.name}__{c.column}")
        if self.indicator:
            names.append(f"{self.name}__matched")
        return names

    @property
    def origins(self) -> list[str | None]:
        """The table column each feature copies (None: one-hot and indicator)."""
        out: list[str | None] = []
        for c in self.columns:
            out += [None] * len(c.categories) if c.kind == "onehot" else [c.column]
        return out + [None] * int(self.indicator)

    @property
    def categories(self) -> dict[str, list[Any]]:
        return {
            f"{self.name}__{c.column}": list(c.categories)
            for c in self.columns
            if c.kind == "onehot"
        }


def is_categorical(s: pd.Series, forced: Sequence[str]) -> bool:
    """Whether a column is one-hot encoded: listed, categorical, string or object."""
    if s.name in forced:
        return True
    dt = s.dtype
    return (
        isinstance(dt, pd.CategoricalDtype)
        or pd.api.types.is_string_dtype(dt)
        or pd.api.types.is_object_dtype(dt)
    )


def check_impute(impute: Any, label: str, arg: str) -> None:
    valid = impute is None or impute in IMPUTE_NAMES
    if not valid and isinstance(impute, numbers.Real) and not isinstance(impute, bool):
        valid = bool(np.isfinite(impute))
    if not valid:
        raise ValueError(
            f"{arg} of table {label!r} must be None, 'zero', 'mean', 'median', "
            f"'joined_mean', 'missing' or a finite number, got {impute!r}."
        )


# ----------------------------------------------------------------- fitting
def derive_encoding(
    frame: pd.DataFrame,
    features: Sequence[str],
    forced: Sequence[str],
    impute: Impute,
    indicator: bool,
    label: str,
    counts: np.ndarray | None,
    impute_hint: str,
) -> tuple[TableEncoding, dict[str, np.ndarray]]:
    """Fit the encoding of a table's features to the rows the dataset uses.

    Parameters
    ----------
    counts : ndarray of int, optional
        Dataset rows per table row (what a join repeats or drops); None when every
        table row is one dataset row.

    Returns
    -------
    encoding : TableEncoding
    codes : dict
        The category codes of each one-hot column under its encoding (-1: missing),
        computed on the way, for :func:`encode_table` to reuse.
    """
    used = None if counts is None else counts > 0
    columns: list[ColumnEncoding] = []
    codes_of: dict[str, np.ndarray] = {}
    for col in features:
        s = frame[col]
        if is_categorical(s, forced):
            cats, codes = _fit_categories(s, used)
            missing = codes < 0 if used is None else (codes < 0) & used
            if impute is None and missing.any():
                raise ValueError(
                    f"source {label!r}, column {col!r} has {int(missing.sum())} "
                    f"missing values; pass {impute_hint} to encode them as all-zero "
                    "rows."
                )
            columns.append(
                ColumnEncoding(col, "onehot", cats, impute, None, str(s.dtype))
            )
            codes_of[col] = codes
        else:
            _check_numeric(s, label, col)
            # "missing" keeps NaN (for estimators that route missing values).
            fill = (
                None
                if impute is None or impute == "missing"
                else _fill_value(s, impute, counts)
            )
            columns.append(
                ColumnEncoding(col, "numeric", (), impute, fill, str(s.dtype))
            )
    return TableEncoding(label, tuple(columns), bool(indicator)), codes_of


def _fit_categories(
    s: pd.Series, used: np.ndarray | None
) -> tuple[tuple[Any, ...], np.ndarray]:
    """The sorted categories that occur in the used rows, and every row's code.

    As ``OneHotEncoder(categories="auto")`` on the joined table: a category that
    no dataset row takes (an unused level of a pandas Categorical, a value only
    rows outside the join have) gets no column.
    """
    cat = s if isinstance(s.dtype, pd.CategoricalDtype) else s.astype("category")
    levels = cat.cat.categories
    codes = cat.cat.codes.to_numpy().astype(np.int64)
    sel = codes >= 0 if used is None else (codes >= 0) & used
    present = np.bincount(codes[sel], minlength=len(levels)) > 0
    order = _sorted_order(levels)
    keep = order[present[order]]
    recode = np.full(len(levels) + 1, -1, dtype=np.int64)
    recode[keep] = np.arange(keep.shape[0])
    # codes == -1 reads recode[-1], the sentinel.
    return tuple(levels[keep].tolist()), recode[codes]


def _sorted_order(levels: pd.Index) -> np.ndarray:
    """Positions of ``levels`` in sorted order (by text for mixed types)."""
    if levels.is_monotonic_increasing:
        return np.arange(len(levels))
    try:
        return np.asarray(levels.argsort(), dtype=np.int64)
    except TypeError:
        keys = [(type(v).__name__, str(v)) for v in levels]
        return np.asarray(sorted(range(len(keys)), key=keys.__getitem__))


def _check_numeric(s: pd.Series, label: str, col: str) -> None:
    if pd.api.types.is_complex_dtype(s.dtype):
        raise ValueError(
            f"Complex data not supported: source {label!r}, column {col!r} has "
            f"complex dtype {s.dtype}; datasets, "
            "as scikit-learn's estimators, take real values only. Pass the real "
            "part, or the real and imaginary parts as two columns."
        )
    if not (
        pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype)
    ):
        raise TypeError(
            f"source {label!r}, column {col!r} has dtype {s.dtype}, which is neither "
            "numeric nor categorical; convert it or list it in categorical=[...]."
        )


def _fill_value(s: pd.Series, impute: Impute, counts: np.ndarray | None) -> float:
    """The number that replaces a missing value (see ``Join.impute``)."""
    if impute == "zero":
        return 0.0
    if not isinstance(impute, str):
        return float(impute)
    v = s.to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(v)
    if impute == "joined_mean":
        # The mean over the dataset's rows: a table row counts once per dataset row
        # that takes it, which is what SimpleImputer sees on the joined table.
        w = np.ones(v.shape[0]) if counts is None else counts.astype(np.float64)
        w = np.where(ok, w, 0.0)
        total = w.sum()
        return float(np.dot(w, np.where(ok, v, 0.0)) / total) if total > 0 else 0.0
    if not ok.any():
        return 0.0
    return float(np.mean(v[ok]) if impute == "mean" else np.median(v[ok]))


# ----------------------------------------------------------------- applying
def _float_block(
    frame: pd.DataFrame, features: Sequence[str], dtype: np.dtype
) -> np.ndarray | None:
    """The features as one new C-ordered matrix when all are finite NumPy floats.

    pandas keeps such columns in one 2-D block, which ``to_numpy`` returns as a
    transposed view: one transposed copy gives the matrix, where writing column by
    column into a C-ordered matrix touches a cache line per value, which costs
    more once the matrix no longer fits in the cache. None when a column is not a
    NumPy float or any value is NaN or infinite: the column-by-column path then
    imputes or names the column.
    """
    if not features or not all(
        isinstance(frame[c].dtype, np.dtype) and frame[c].dtype.kind == "f"
        for c in features
    ):
        return None
    values = frame[list(features)].to_numpy()
    if not np.isfinite(values).all() or _overflows(values, dtype):
        return None
    # A copy in every case: the result never shares memory with the frame.
    return np.array(values, dtype=dtype, order="C")


def _overflows(values: np.ndarray, dtype: np.dtype) -> bool:
    """Whether casting the finite ``values`` to ``dtype`` overflows to infinity."""
    dtype = np.dtype(dtype)
    if values.dtype.itemsize <= dtype.itemsize or not values.size:
        return False
    return bool(np.nanmax(np.abs(values)) > np.finfo(dtype).max)


def _check_range(v: np.ndarray, dtype: np.dtype, label: str, col: str) -> None:
    """Refuse values of a numeric column beyond ``dtype``'s range: cast, they
    would be infinite, which is no missing value to impute."""
    if _overflows(v, dtype):
        top = float(np.finfo(dtype).max)
        largest = float(np.nanmax(np.abs(v)))
        raise ValueError(
            f"source {label!r}, column {col!r} has values up to {largest:.3g}, "
            f"beyond the range of {np.dtype(dtype).name} ({top:.3g}): they would "
            "overflow to infinity. Build the dataset with dtype=np.float64, or "
            "rescale the column."
        )


def encode_table(
    frame: pd.DataFrame,
    enc: TableEncoding,
    dtype: np.dtype,
    sparse: bool,
    *,
    used: np.ndarray | None = None,
    codes_of: dict[str, np.ndarray] | None = None,
    impute_hint: str = "impute=... on its Join",
) -> tuple[Any, dict[str, tuple[int, list[Any], Any]]]:
    """Encode a table with a fitted encoding.

    Parameters
    ----------
    used : ndarray of bool, optional
        The rows some dataset row takes (None: all). Missing values elsewhere are
        never read by the dataset: they become zeros instead of raising.
    codes_of : dict, optional
        Category codes from :func:`derive_encoding`.

    Returns
    -------
    S : ndarray, CSR matrix or None
        The encoded table (None without columns).
    unknown : dict
        Per one-hot column with values outside its categories in used rows: their
        count, the first few distinct values (they are encoded as zeros) and the
        column's training and current dtypes when they differ (else None).
    """
    n = len(frame)
    names = enc.feature_names
    unknown: dict[str, tuple[int, list[Any], Any]] = {}
    if not names:
        return None, unknown
    any_cat = any(c.kind == "onehot" for c in enc.columns)
    numeric = [c.column for c in enc.columns]
    # All-numeric tables (the common case) are written straight into one
    # preallocated matrix: collecting columns first would hold them twice.
    direct = None
    if not any_cat:
        if not enc.indicator and n * len(numeric) >= _BLOCK_COPY_MIN:
            fast = _float_block(frame, numeric, dtype)
            if fast is not None:
                return fast, unknown
        direct = np.empty((n, len(names)), dtype=dtype)
    blocks: list[Any] = []
    j = 0
    for c in enc.columns:
        s = frame[c.column]
        if c.kind == "onehot":
            codes = None if codes_of is None else codes_of.get(c.column)
            if codes is None:
                codes = _category_codes(s, c.categories)
            missing = codes < 0
            if used is not None:
                missing &= used
            if missing.any():
                na = s.isna().to_numpy()
                strange = missing & ~na
                if strange.any():
                    values = pd.unique(s[strange])
                    changed = (
                        (c.dtype, str(s.dtype))
                        if c.dtype and c.dtype != str(s.dtype)
                        else None
                    )
                    unknown[c.column] = (int(strange.sum()), list(values[:5]), changed)
                if c.impute is None and (missing & na).any():
                    raise ValueError(
                        f"source {enc.name!r}, column {c.column!r} has "
                        f"{int((missing & na).sum())} missing values; pass "
                        f"{impute_hint} to encode them as all-zero rows."
                    )
            keep = codes >= 0
            block = sp.csr_matrix(
                (
                    np.ones(int(keep.sum()), dtype=dtype),
                    (np.flatnonzero(keep), codes[keep]),
                ),
                shape=(n, len(c.categories)),
            )
            blocks.append(block)
            j += len(c.categories)
            continue
        _check_numeric(s, enc.name, c.column)
        v = _numeric_values(s, c, enc.name, used, impute_hint)
        _check_range(v, dtype, enc.name, c.column)
        if direct is not None:
            direct[:, j] = v
        else:
            blocks.append(v.astype(dtype, copy=False))
        j += 1
    if enc.indicator:
        if direct is not None:
            direct[:, j] = 1.0
        else:
            blocks.append(np.ones(n, dtype=dtype))
    if direct is not None:
        return direct, unknown
    if any_cat and sparse:
        S = sp.hstack(
            [sp.csr_matrix(b if b.ndim == 2 else b[:, None]) for b in blocks],
            format="csr",
            dtype=dtype,
        )
        return S, unknown
    # Fill one preallocated matrix column by column: stacking 2-D blocks would hold
    # every column twice at the peak.
    S = np.empty((n, len(names)), dtype=dtype)
    j = 0
    for b in blocks:
        width = 1 if b.ndim == 1 else b.shape[1]
        S[:, j : j + width] = (
            b.toarray() if sp.issparse(b) else (b[:, None] if b.ndim == 1 else b)
        )
        j += width
    return S, unknown


def _category_codes(s: pd.Series, categories: tuple[Any, ...]) -> np.ndarray:
    """Codes of ``s`` under ``categories`` (-1: missing or not a category)."""
    if not categories:
        return np.full(len(s), -1, dtype=np.int64)
    # Values of another type than the categories (text against numbers) match
    # nothing, which the caller reports as unknown categories.
    codes = pd.Index(list(categories)).get_indexer(s)
    return codes.astype(np.int64, copy=False)


def _numeric_values(
    s: pd.Series,
    c: ColumnEncoding,
    label: str,
    used: np.ndarray | None,
    impute_hint: str,
) -> np.ndarray:
    """A numeric column as float64, missing values replaced by the fill value."""
    v = s.to_numpy(dtype=np.float64, na_value=np.nan)
    # One pass for the common all-finite column: its sum is finite (a sum that
    # overflows only costs the checks below).
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(v.sum()):
            return v
    inf = np.isinf(v)
    bad = np.isnan(v)
    if used is not None:
        inf &= used
        bad_used = bad & used
    else:
        bad_used = bad
    if inf.any():
        raise ValueError(
            f"source {label!r}, column {c.column!r} contains infinite values."
        )
    if c.impute == "missing":
        # NaN stays: the dataset holds missing values (``allows_nan``).
        return v
    if bad_used.any() and c.fill is None:
        raise ValueError(
            f"source {label!r}, column {c.column!r} has {int(bad_used.sum())} NaN "
            f"values; pass {impute_hint} ('zero', 'mean', 'median', 'joined_mean' "
            "or a number)."
        )
    # Rows no dataset row takes are never read: any finite value will do.
    return np.where(np.isfinite(v), v, 0.0 if c.fill is None else c.fill)
