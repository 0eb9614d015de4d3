"""Reading a spec's tables and building its dataset and target.

The data half of :class:`~ilargi_sklearn.cli.FitSpec`, whose ``read_tables`` and
``build_from`` call these functions: read only the columns the spec uses, cast
them as it asks, join with :func:`~ilargi_sklearn.multisource.from_frames` (or a saved
model's schema), and report every problem as a :class:`SpecError` at the spec key
that causes it.
"""

from __future__ import annotations

import difflib
import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ilargi_sklearn.cli._toml import SpecError
from ilargi_sklearn.multisource._builder import DEFAULT_MIN_MATCH, ROW_NUMBER

if TYPE_CHECKING:
    from ilargi_sklearn.cli._console import Console


def read_tables(
    spec: Any,
    console: Console | None = None,
    *,
    target: bool = True,
    extra: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """:meth:`FitSpec.read_tables`: the tables of ``spec``, checked."""
    need = _needed_columns(spec, target)
    for name, cols in (extra or {}).items():
        need[name] = list(dict.fromkeys(need[name] + list(cols)))
    frames: dict[str, Any] = {}
    bar = console.progress(len(spec.tables), "reading tables") if console else None
    try:
        for name in spec.tables:
            frames[name] = _read_table(spec, name, need[name])
            if bar is not None:
                bar.advance(note=name)
    finally:
        if bar is not None:
            bar.close()
    return frames


def _needed_columns(spec: Any, target: bool = True) -> dict[str, list[str]]:
    """Columns each table must provide (keys, features, and the target)."""
    need: dict[str, list[str]] = {n: [] for n in spec.tables}
    names = {spec.base: spec.base}
    for name, t in spec.tables.items():
        need[name] += spec._names(t, "numeric", ("tables", name))
        need[name] += spec._names(t, "categorical", ("tables", name))
        need[name] += spec._names(t, "strip", ("tables", name))
    for i, j in enumerate(spec.joins, start=1):
        names[j.get("name", j["table"])] = j["table"]
        lk, rk = spec._join_keys(i, j)
        left_table = names[j.get("via", spec.base)]
        need[left_table] += lk
        need[j["table"]] += [k for k in rk if k != ROW_NUMBER]
        need[j["table"]] += spec._names(j, "numeric", ("joins", i))
        need[j["table"]] += spec._names(j, "categorical", ("joins", i))
    spec_target = spec.data.get("target")
    if spec_target and target:
        need[spec.base].append(spec_target["column"])
    return {k: list(dict.fromkeys(v)) for k, v in need.items()}


def _table_path(spec: Any, name: str) -> Path:
    raw = spec.tables[name]["path"]
    p = Path(raw).expanduser()
    return p if p.is_absolute() else (spec.path.parent / p)


def _read_table(spec: Any, name: str, columns: list[str]) -> Any:
    t = spec.tables[name]
    path = _table_path(spec, name)
    key = ("tables", name, "path")
    if not path.is_file():
        raise spec.error(
            f"file {t['path']!r} not found (looked for {str(path.resolve())!r}; "
            "paths are relative to the spec file).",
            *key,
        )
    from ilargi_sklearn.datasets._io import (
        MalformedRowError,
        MissingColumnsError,
        read_table,
    )

    try:
        frame = read_table(path, columns, fmt=t.get("format"), sep=t.get("sep", ","))
    except MissingColumnsError as exc:
        col = exc.missing[0]
        header = [str(h) for h in exc.columns]
        hint = difflib.get_close_matches(col, header, n=1)
        extra = f" Did you mean {hint[0]!r}?" if hint else ""
        raise spec.error(
            f"column {col!r} not found in {t['path']!r} (table {name!r}); its "
            f"columns are {header}.{extra}",
            *_where_column(spec, name, col),
        ) from None
    except MalformedRowError as exc:
        raise spec.error(str(exc), *key) from None
    except ImportError as exc:
        raise spec.error(
            f"reading Parquet needs pyarrow ({exc}); pip install pyarrow, or "
            "convert the table to CSV.",
            *key,
        ) from None
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's
        raise spec.error(
            f"cannot read {t['path']!r}: {type(exc).__name__}: {exc}", *key
        ) from None
    if len(frame) == 0:
        raise spec.error(f"table {name!r} ({t['path']!r}) has no rows.", *key)
    for col, kind in t.get("cast", {}).items():
        if col in frame.columns:
            frame[col] = _cast(spec, frame[col], kind, ("tables", name, "cast", col))
    for col in spec._names(t, "strip", ("tables", name)):
        if col in frame.columns:
            frame[col] = _strip(spec, frame[col], ("tables", name, "strip"))
    return frame


def _strip(spec: Any, s: Any, key: tuple[Any, ...]) -> Any:
    """A text column without surrounding whitespace and quotes (``strip = [...]``)."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype):
        raise spec.error(
            f"strip applies to text columns; column {s.name!r} holds {s.dtype} values.",
            *key,
        )
    text = s.astype("str").where(s.notna())
    return text.str.strip().str.strip("\"'").str.strip()


def _cast(spec: Any, s: Any, kind: str, key: tuple[Any, ...]) -> Any:
    """A column converted as ``cast = { COLUMN = KIND }`` asks."""
    import pandas as pd

    if kind == "string":
        if pd.api.types.is_float_dtype(s.dtype):
            # Whole numbers read as floats (a column with gaps) print as "12".
            whole = s.dropna()
            if (whole == whole.round()).all():
                s = s.astype("Int64")
        return s.astype("string").astype("str")
    text = (
        s.astype("str").str.strip() if not pd.api.types.is_numeric_dtype(s.dtype) else s
    )
    num = pd.to_numeric(text, errors="coerce")
    bad = num.isna() & s.notna()
    if bad.any():
        raise spec.error(
            f"cannot cast column {s.name!r} to {kind}: values such as "
            f"{s[bad].head(3).tolist()} are not numbers.",
            *key,
        )
    if kind == "float":
        return num.astype("float64")
    whole = num.dropna()
    if not (whole == whole.round()).all():
        raise spec.error(
            f"cannot cast column {s.name!r} to int: values such as "
            f"{whole[whole != whole.round()].head(3).tolist()} are not whole "
            'numbers; cast it to "float".',
            *key,
        )
    # Nullable integers keep gaps as missing values instead of turning floats.
    return num.astype("Int64") if num.isna().any() else num.astype("int64")


def _where_column(spec: Any, table: str, col: str) -> tuple[Any, ...]:
    """The spec key that asks table ``table`` for column ``col``."""
    t = spec.tables[table]
    for k in ("numeric", "categorical", "key", "strip"):
        if col in spec._names(t, k, ("tables", table)):
            return ("tables", table, k)
    target = spec.data.get("target") or {}
    if table == spec.base and target.get("column") == col:
        return ("target", "column")
    names = {spec.base: spec.base}
    for i, j in enumerate(spec.joins, start=1):
        names[j.get("name", j["table"])] = j["table"]
        left_table = names[j.get("via", spec.base)]
        for k in ("on", "left_on", "right_on", "numeric", "categorical"):
            if col not in spec._names(j, k, ("joins", i)):
                continue
            side = (
                left_table
                if k == "left_on"
                else j["table"]
                if k in ("right_on", "numeric", "categorical")
                else None
            )
            if side in (None, table):
                return ("joins", i, k)
    return ("tables", table)


def build_dataset(
    spec: Any,
    frames: dict[str, Any],
    *,
    n_rows: int | None = None,
    schema: Any = None,
    handle_unknown: str = "warn",
) -> tuple[Any, Any, dict[str, Any]]:
    """:meth:`FitSpec.build_from`: the dataset, target and figures of ``spec``."""
    from ilargi_sklearn.multisource import Join, from_frames

    info: dict[str, Any] = {}
    base = frames[spec.base]
    target = spec.data.get("target") if schema is None else None
    if target:
        col = target["column"]
        keep = base[col].notna().to_numpy()
        info["rows_without_target"] = int((~keep).sum())
        if not keep.any():
            raise spec.error(
                f"target column {col!r} has no values.", "target", "column"
            )
        if not keep.all():
            base = base[keep].reset_index(drop=True)
        _check_target_type(spec, base[col], target)
    if n_rows is not None:
        base = base.iloc[: int(n_rows)].reset_index(drop=True)
    bt = spec.tables[spec.base]
    joins, labels = [], {}
    for i, j in enumerate(spec.joins, start=1):
        t = spec.tables[j["table"]]
        key = ("joins", i)
        lk, rk = spec._join_keys(i, j)
        name = j.get("name", j["table"])
        labels[name] = key
        # A join's numeric/categorical lists replace the table's, one by one.
        numeric = spec._names(j if "numeric" in j else t, "numeric", key)
        categorical = spec._names(j if "categorical" in j else t, "categorical", key)
        _check_numeric(
            spec,
            frames[j["table"]],
            numeric,
            key if "numeric" in j else ("tables", j["table"]),
            j["table"],
        )
        keys = (
            {"left_on": lk, "row_number": j["row_number"]}
            if "row_number" in j
            else {"left_on": lk, "right_on": rk}
        )
        joins.append(
            Join(
                frames[j["table"]],
                **keys,
                features=numeric + categorical,
                categorical=categorical,
                how=j.get("how", "left"),
                name=name,
                via=j.get("via"),
                impute=j.get("impute", t.get("impute")),
                indicator=j.get("indicator", False),
                nulls_equal=j.get("nulls_equal", False),
                min_match=j.get("min_match"),
                validate=j.get("validate"),
            )
        )
    t0 = time.perf_counter()
    base_num = spec._names(bt, "numeric", ("tables", spec.base))
    base_cat = spec._names(bt, "categorical", ("tables", spec.base))
    _check_numeric(spec, base, base_num, ("tables", spec.base), spec.base)
    min_match = spec.data.get("min_match", DEFAULT_MIN_MATCH)
    try:
        # The builder's warnings speak Python (Join(...), .str.strip()): they are
        # raised again with the spec's words added.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if schema is not None:
                ds = schema.build(
                    base, joins, handle_unknown=handle_unknown, min_match=min_match
                )
                y = None
            else:
                ds, y = from_frames(
                    base,
                    base_num + base_cat,
                    joins,
                    base_name=spec.base,
                    base_categorical=base_cat,
                    base_impute=bt.get("impute"),
                    dtype=spec.data.get("dtype", "float64"),
                    min_match=min_match,
                    target=target["column"] if target else None,
                )
    except (ValueError, TypeError) as exc:
        raise _locate_build_error(spec, str(exc), labels) from None
    for w in caught:
        warnings.warn_explicit(
            str(w.message) + _spec_hints(spec, str(w.message)),
            w.category,
            w.filename,
            w.lineno,
        )
    info["build_seconds"] = time.perf_counter() - t0
    if y is not None:
        # Rows an outer join added come from no base row: they have no target.
        orphans = ds.base_rows_ < 0
        if orphans.any():
            info["rows_without_base_row"] = int(orphans.sum())
            ds, y = ds[~orphans], y[~orphans]
        y = _target_values(spec, y.to_numpy(), target)
    info["n_rows"] = int(ds.shape[0])
    info["n_base_rows"] = int(len(base))
    return ds, y, info


def _check_target_type(spec: Any, s: Any, target: dict[str, Any]) -> None:
    """A text target fails before any data is built when a regressor or a
    threshold needs numbers: the error names the column and what to do."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype):
        return
    threshold = "threshold" in target
    if not threshold and spec.task != "regression":
        return
    col = target["column"]
    values = s.dropna()
    example = values.iloc[0] if len(values) else None
    table = f"[tables.{spec.base}]"
    as_numbers = pd.to_numeric(values.astype("str").str.strip(), errors="coerce")
    cast = f'cast = {{ {col} = "float" }} in {table}'
    if len(values) and as_numbers.notna().all():
        fix = f"the values are numbers stored as text: {cast} reads them as numbers."
    elif len(values) and as_numbers.notna().mean() >= 0.5:
        odd = values[as_numbers.isna()].unique()[:3].tolist()
        fix = (
            f"most values are numbers, but values such as {odd} are not: fix or "
            f"remove them in the file, then {cast} reads the column as numbers."
        )
    else:
        from ilargi_sklearn.cli._checks import classifier_names

        fix = (
            "for a text target, use a classifier: name = "
            + " or ".join(f'"{n}"' for n in classifier_names())
            + " in [estimator]"
            + (
                "; threshold turns a numeric column into a yes/no target."
                if threshold
                else " (threshold = NUMBER in [target] turns a numeric column into a "
                "yes/no target)."
            )
        )
    who = (
        "threshold needs a numeric target"
        if threshold
        else f"{spec.estimator_class().__name__} is a regressor and needs numbers"
    )
    raise spec.error(
        f"target column {col!r} of table {spec.base!r} holds text ({s.dtype}, e.g. "
        f"{example!r}); {who}: {fix}",
        "target",
        "threshold" if threshold else "column",
    )


def _target_values(spec: Any, y: np.ndarray, target: dict[str, Any]) -> np.ndarray:
    if "threshold" not in target:
        return y
    try:
        return (y.astype(np.float64) > float(target["threshold"])).astype(np.int64)
    except (TypeError, ValueError):
        raise spec.error(
            f"threshold needs a numeric target; column {target['column']!r} "
            f"holds {y.dtype} values.",
            "target",
            "threshold",
        ) from None


def _check_numeric(
    spec: Any, frame: Any, columns: list[str], key: tuple[Any, ...], table: str
) -> None:
    import pandas as pd

    for col in columns:
        s = frame[col]
        if not (
            pd.api.types.is_numeric_dtype(s.dtype)
            or pd.api.types.is_bool_dtype(s.dtype)
        ):
            example = s.dropna().iloc[0] if s.notna().any() else None
            raise spec.error(
                f"column {col!r} of table {table!r} is listed as numeric but holds "
                f"{s.dtype} values (e.g. {example!r}); list it under categorical, "
                "or fix the file.",
                *key,
                "numeric",
            )


def _table_of(spec: Any, source: str) -> str:
    """The table behind a source name (a join's name, or the base)."""
    for j in spec.joins:
        if j.get("name", j["table"]) == source:
            return j["table"]
    return source


def _spec_hints(spec: Any, msg: str) -> str:
    """The fixes a builder message suggests, in the spec's terms ("" if none)."""
    hints = []
    m = re.search(
        r"unmatched (\S+)\.(\S+) values match (\S+)\.(\S+) when compared without "
        r"surrounding whitespace",
        msg,
    )
    if m:
        places = " and ".join(
            f'strip = ["{col}"] in [tables.{_table_of(spec, source)}]'
            for source, col in ((m.group(1), m.group(2)), (m.group(3), m.group(4)))
        )
        hints.append(
            f"In the spec: {places} strip whitespace and quotes around the keys."
        )
    if "ignoring letter case" in msg:
        hints.append(
            "A spec cannot change the case of keys: make it agree in the files."
        )
    if "without leading zeros" in msg:
        hints.append(
            'In the spec: cast = { COLUMN = "int" } in the [tables.NAME] sections of '
            "both key columns compares the codes as numbers."
        )
    m = re.search(r"row_number=(-?\d+)", msg)
    if m:
        hints.append(
            f"In the spec: row_number = {m.group(1)} with left_on (and no on, "
            "right_on or key) in the join's [[joins]] entry."
        )
    m = re.search(r"declare them with validate='(\w+)'", msg)
    if m:
        hints.append(
            f'In the spec: validate = "{m.group(1)}" in the join\'s [[joins]] entry '
            'declares the repeats ("many_to_one" makes them an error).'
        )
    return "".join(" " + h for h in hints)


def _locate_build_error(spec: Any, msg: str, labels: dict[str, tuple]) -> SpecError:
    msg += _spec_hints(spec, msg)
    if "impute" in msg:
        msg += (
            ' In the spec: impute = "mean" (or "zero", "median", "joined_mean", '
            "a number) in the table's [tables.NAME] section or in its [[joins]] "
            "entry."
        )
    m = re.search(r"(\w+)\.(\w+) holds numbers stored as text", msg)
    if m:
        table = _table_of(spec, m.group(1))
        msg += (
            f' In the spec: cast = {{ {m.group(2)} = "int" }} (or "float") in '
            f"[tables.{table}]."
        )
    elif "incompatible dtypes" in msg:
        msg += (
            ' In the spec: cast = { COLUMN = "string" } (or "int", "float") in '
            "the [tables.NAME] section of one of the two tables makes the key "
            "columns alike."
        )
    if "min_match" in msg:
        msg += (
            " In the spec: min_match = 0.1 (a fraction) in the join's [[joins]] "
            "entry, or at the top of the spec for every join."
        )
    for name, key in labels.items():
        for pattern in (f"join {name!r}", f"source {name!r}", f"table {name!r}"):
            if pattern in msg:
                return spec.error(msg, *key)
    for pattern in (f"source {spec.base!r}", f"table {spec.base!r}"):
        if pattern in msg:
            return spec.error(msg, "tables", spec.base)
    return spec.error(msg, "joins")
