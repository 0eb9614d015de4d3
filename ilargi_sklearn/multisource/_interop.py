"""Tables from polars and pyarrow as pandas DataFrames.

The dataset builders work on pandas DataFrames. :func:`as_pandas` converts the
tables users have (polars DataFrames, pyarrow Tables and RecordBatches, objects with
the Arrow PyCapsule stream interface or the dataframe interchange protocol) after
selecting the needed columns in the table's own library, so that only those are
converted. polars and pyarrow are optional: neither is imported until a table of
theirs arrives, and a polars table converts column by column where pyarrow is
missing.

This is the builder's input handling, so it stays in the data-structure package;
reading files (CSV and Parquet, :func:`ilargi_sklearn.datasets._io.read_table`) is
IO and lives with the dataset loaders.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["MissingColumnsError", "as_pandas"]

logger = logging.getLogger(__name__)

_ACCEPTED = "a pandas, polars or pyarrow table"


class MissingColumnsError(ValueError):
    """Columns asked for that a table or file does not have.

    Attributes
    ----------
    missing : list of str
        The columns not found, in the order asked.
    columns : list of str
        The columns the table or file has.
    """

    def __init__(self, what: str, missing: list[str], columns: list[Any]) -> None:
        self.missing = missing
        self.columns = columns
        super().__init__(
            f"columns {missing} not found in {what}; its columns are {columns}."
        )


# --------------------------------------------------------------------------------
# Tables of other libraries as pandas DataFrames
# --------------------------------------------------------------------------------


def as_pandas(
    frame: Any, what: str, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """A pandas DataFrame of a table from pandas, polars, pyarrow or another library.

    Parameters
    ----------
    frame : pandas.DataFrame, polars.DataFrame, pyarrow.Table or pyarrow.RecordBatch
        The table. Any other object with the Arrow PyCapsule interface
        (``__arrow_c_stream__`` or ``__arrow_c_array__``, converted through pyarrow)
        or the dataframe interchange protocol (``__dataframe__``) is accepted too.
        A polars LazyFrame is refused: collect it first.
    what : str
        The caller's name of the table in error messages, such as ``"base"`` or
        ``"join 'planes': table"``.
    columns : list of str, optional
        The columns to keep, in this order; they are selected before converting, so
        that the others are never converted. Default: all columns.

    Returns
    -------
    pandas.DataFrame
        ``frame`` itself for a pandas DataFrame without ``columns`` (no copy);
        otherwise a new frame with a default index. Numeric Arrow columns without
        missing values and in one chunk arrive without a copy, as read-only arrays.
        Integers with missing values become floats with NaN (pandas' nullable
        integers where a value reaches 2**53, beyond which floats are not exact);
        booleans with missing
        values pandas' ``"boolean"`` dtype; strings pandas' default string dtype;
        dictionary-encoded columns (polars Categorical and Enum) pandas
        Categoricals, with the dictionary's categories and order; dates and
        timestamps ``datetime64`` (time zones kept); decimals ``int64`` when their
        scale is 0 and precision at most 18, ``float64`` otherwise.

    Raises
    ------
    TypeError
        When ``frame`` is not a table; the message names the class received.
    MissingColumnsError
        When ``columns`` names columns that ``frame`` does not have (a
        ``ValueError``).
    ImportError
        When converting ``frame`` needs pyarrow and it is not installed.

    See Also
    --------
    pandas.DataFrame.from_arrow : pandas' own conversion of Arrow tables (pandas 3).
    polars.DataFrame.to_pandas : polars' conversion of a whole frame.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from ilargi_sklearn.multisource._interop import as_pandas
    >>> table = pa.table({"a": [1, 2], "b": ["x", "y"], "c": [0.5, None]})
    >>> df = as_pandas(table, "base", ["c", "a"])
    >>> df.dtypes.astype(str).tolist()
    ['float64', 'int64']
    """
    columns = _column_list(columns)
    if isinstance(frame, pd.DataFrame):
        if columns is None:
            return frame
        _check_columns(list(frame.columns), columns, what)
        return frame[columns]
    cls = type(frame)
    lib = cls.__module__.partition(".")[0]
    received = _type_name(frame)
    if lib == "polars" and cls.__name__ == "DataFrame":
        return _from_polars(frame, what, columns)
    if lib == "polars" and cls.__name__ == "LazyFrame":
        raise TypeError(
            f"{what} must be {_ACCEPTED}, got {received}: call .collect() on it first "
            "(after .select() of the columns you need, to compute only those)."
        )
    if lib == "pyarrow":
        import pyarrow as pa

        if isinstance(frame, pa.RecordBatch):
            frame = pa.Table.from_batches([frame])
        if isinstance(frame, pa.Table):
            return _from_arrow(frame, what, columns)
    if lib == "dask":
        raise TypeError(
            f"{what} must be {_ACCEPTED}, got {received}: build the dataset with "
            "ilargi_sklearn.distributed.dask_from_frames, or .compute() the frame."
        )
    if lib not in ("pandas", "polars", "pyarrow"):
        has_arrow = hasattr(frame, "__arrow_c_stream__") or hasattr(
            frame, "__arrow_c_array__"
        )
        if has_arrow and (
            _pyarrow() is not None or not hasattr(frame, "__dataframe__")
        ):
            return _from_arrow(_arrow_capsule_table(frame, what), what, columns)
        if hasattr(frame, "__dataframe__"):
            return _from_interchange(frame, what, columns)
    raise TypeError(f"{what} must be {_ACCEPTED}, got {received}.")


def _column_list(columns: str | Sequence[str] | None) -> list[str] | None:
    """The columns once each, in order; a string is one column."""
    if columns is None:
        return None
    return [columns] if isinstance(columns, str) else list(dict.fromkeys(columns))


def _type_name(obj: Any) -> str:
    cls = type(obj)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _check_columns(names: list[Any], columns: Sequence[str], what: str) -> None:
    present = set(names)
    missing = [c for c in columns if c not in present]
    if missing:
        raise MissingColumnsError(what, missing, names)


def _pyarrow() -> Any:
    """pyarrow, or None where it is not installed."""
    try:
        import pyarrow
    except ImportError:
        return None
    return pyarrow


def _decimal_as_int(precision: int, scale: int) -> bool:
    """Whether decimals of this type fit int64 exactly (else they become float64)."""
    return scale == 0 and precision <= 18


def _arrow_capsule_table(frame: Any, what: str) -> Any:
    received = _type_name(frame)
    pa = _pyarrow()
    if pa is None:
        raise ImportError(
            f"converting {what} ({received}) through Arrow needs pyarrow: pip install "
            "pyarrow."
        )
    try:
        return pa.table(frame)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise TypeError(
            f"{what} must be {_ACCEPTED}, got {received}, whose Arrow data is not a "
            f"table ({exc})."
        ) from exc


def _from_arrow(table: Any, what: str, columns: list[str] | None) -> pd.DataFrame:
    if columns is not None:
        _check_columns(table.column_names, columns, what)
        table = table.select(columns)
    return _arrow_to_pandas(table)


def _arrow_to_pandas(table: Any) -> pd.DataFrame:
    """Convert a pyarrow Table with the dtypes that :func:`as_pandas` documents."""
    import pyarrow as pa

    nullable_bools, exact_ints = [], []
    for i, field in enumerate(table.schema):
        if pa.types.is_decimal(field.type):
            exact = _decimal_as_int(field.type.precision, field.type.scale)
            target = pa.int64() if exact else pa.float64()
            table = table.set_column(
                i, field.name, table.column(i).cast(target, safe=exact)
            )
        elif pa.types.is_boolean(field.type) and table.column(i).null_count:
            nullable_bools.append(field.name)
        elif pa.types.is_integer(field.type) and table.column(i).null_count:
            if not _exact_as_float(table.column(i)):
                exact_ints.append(i)
    # split_blocks: one block per column, so that a numeric column without missing
    # values in one chunk is a view of the Arrow buffer instead of a copy into a
    # consolidated 2-D block. date_as_object=False: dates as datetime64, which the
    # builder's key and encoding rules know (datetime.date objects they take for
    # strings). ignore_metadata: a default index, whatever pandas wrote the table.
    frame = table.to_pandas(
        split_blocks=True, date_as_object=False, ignore_metadata=True
    )
    for name in nullable_bools:
        frame[name] = frame[name].astype("boolean")
    for i in exact_ints:
        # As floats, integers beyond 2**53 would merge with their neighbours (keys
        # such as 64-bit ids): pandas' nullable integers keep them exact.
        field = table.schema.field(i)
        bits = field.type.bit_width
        unsigned = pa.types.is_unsigned_integer(field.type)
        nullable = pd.api.types.pandas_dtype(f"{'U' if unsigned else ''}Int{bits}")
        frame.isetitem(
            i, table.column(i).to_pandas(types_mapper={field.type: nullable}.get)
        )
    return frame


def _exact_as_float(column: Any) -> bool:
    """Whether an Arrow integer column's values are below 2**53 in magnitude:
    exact as float64, and never equal to the float of an integer beyond it (which
    rounds to 2**53 or more), so that keys of both kinds compare exactly."""
    import pyarrow.compute as pc

    bounds = pc.min_max(column)
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    return lo is None or max(abs(lo), abs(hi)) < 2**53


def _from_polars(frame: Any, what: str, columns: list[str] | None) -> pd.DataFrame:
    if columns is not None:
        _check_columns(frame.columns, columns, what)
        frame = frame.select(columns)
    if _pyarrow() is not None:
        return _arrow_to_pandas(frame.to_arrow())
    logger.info(
        "pyarrow is not installed: converting %s (a polars DataFrame) column by column.",
        what,
    )
    return pd.DataFrame(
        {
            name: _polars_column(s)
            for name, s in zip(frame.columns, frame.get_columns())
        },
        copy=False,
    )


def _polars_column(s: Any) -> Any:
    """One polars Series as the array :func:`_arrow_to_pandas` would give."""
    import polars as pl

    dt = s.dtype
    if isinstance(dt, pl.Decimal):
        s = s.cast(pl.Int64 if _decimal_as_int(dt.precision, dt.scale) else pl.Float64)
        dt = s.dtype
    if isinstance(dt, pl.Enum):
        # An Enum's physical codes index its categories.
        return pd.Categorical.from_codes(
            _polars_codes(s), categories=list(dt.categories), ordered=True
        )
    if isinstance(dt, pl.Categorical):
        # Arrow's dictionary of a polars Categorical lists the values in order of
        # first appearance; the physical codes index a mapping shared by all
        # Categoricals of the process.
        present = s.drop_nulls().unique(maintain_order=True)
        known = present.to_physical().to_numpy()
        order = np.argsort(known)
        codes = _polars_codes(s)
        found = codes >= 0
        codes[found] = order[np.searchsorted(known, codes[found], sorter=order)]
        return pd.Categorical.from_codes(
            codes, categories=present.cast(pl.String).to_list()
        )
    if dt == pl.String:
        return pd.Series(s.to_numpy(), dtype=_string_dtype()).array
    if dt == pl.Null:
        return np.full(len(s), None, dtype=object)
    if dt == pl.Boolean and s.null_count():
        return pd.array(s.to_numpy(), dtype="boolean")
    if dt.is_integer() and s.null_count():
        if max(abs(s.min()), abs(s.max())) >= 2**53:
            # As _arrow_to_pandas: exact beyond float64's integers.
            nullable = "UInt64" if dt.is_unsigned_integer() else "Int64"
            return pd.array(s.to_list(), dtype=nullable)
        # polars gives float32 for small integers with nulls; Arrow float64.
        return s.cast(pl.Float64).to_numpy()
    if dt == pl.Date:
        return s.to_numpy().astype("datetime64[ms]")
    if isinstance(dt, pl.Datetime) and dt.time_zone is not None:
        # to_numpy gives the instants in UTC, without the zone.
        utc = pd.Series(s.to_numpy()).dt.tz_localize("UTC")
        return utc.dt.tz_convert(dt.time_zone).array
    return s.to_numpy()


def _polars_codes(s: Any) -> np.ndarray:
    """The physical codes of a polars Categorical or Enum, -1 where missing."""
    physical = s.to_physical()
    codes = physical.fill_null(0).to_numpy().astype(np.int64)
    codes[physical.is_null().to_numpy()] = -1
    return codes


def _string_dtype() -> Any:
    """pandas' default dtype of strings (``str`` from pandas 3, object before)."""
    return pd.Series(["a"]).dtype


def _from_interchange(frame: Any, what: str, columns: list[str] | None) -> pd.DataFrame:
    exchange = frame.__dataframe__(allow_copy=True)
    if columns is not None:
        _check_columns(list(exchange.column_names()), columns, what)
        exchange = exchange.select_columns_by_name(columns)
    pa = _pyarrow()
    if pa is not None:
        from pyarrow.interchange import from_dataframe

        return _arrow_to_pandas(from_dataframe(exchange, allow_copy=True))
    return pd.api.interchange.from_dataframe(exchange, allow_copy=True)
