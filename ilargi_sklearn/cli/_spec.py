"""A fit spec: the TOML file that ``ilargi fit`` reads, checked and turned into a
dataset and an estimator.

:func:`load_spec` reads and checks a spec (:mod:`ilargi_sklearn.cli._checks`);
:class:`FitSpec` builds its estimator, reads its tables (only the columns it uses)
and builds the dataset and the target. Every problem is a :class:`SpecError` at the
key and line to edit.
"""

from __future__ import annotations

import difflib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ilargi_sklearn.cli._checks import (
    ESTIMATORS,
    check_spec,
    estimator_key,
    estimator_names,
)
from ilargi_sklearn.cli._toml import SpecError, find_line, read_toml
from ilargi_sklearn.dataset._builder import DEFAULT_MIN_MATCH, ROW_NUMBER

if TYPE_CHECKING:
    from ilargi_sklearn.cli._console import Console

__all__ = ["FitSpec", "load_spec"]

_TYPE_NAMES = {
    str: "a string",
    list: "a list",
    dict: "a table",
    bool: "true/false",
    int: "an integer",
    float: "a number",
}


@dataclass
class FitSpec:
    """A parsed and checked fit spec (see :func:`load_spec`).

    Attributes
    ----------
    path : pathlib.Path
        The spec file; table paths are relative to its folder.
    data : dict
        The parsed TOML document.
    text : str
        Its source (for line numbers in errors).
    """

    path: Path
    data: dict[str, Any]
    text: str = field(repr=False, default="")

    # --------------------------------------------------------------- errors
    def error(self, message: str, *key: Any) -> SpecError:
        return SpecError(
            message, path=self.path, key=key, line=find_line(self.text, key)
        )

    def _get(self, table: dict, name: str, key: tuple, types: tuple, default=None):
        if name not in table:
            return default
        value = table[name]
        if not isinstance(value, types) or (
            isinstance(value, bool) and bool not in types
        ):
            expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
            raise self.error(
                f"expected {expected}, got {type(value).__name__} {value!r}.",
                *key,
                name,
            )
        return value

    def _names(self, table: dict, name: str, key: tuple) -> list[str]:
        value = self._get(table, name, key, (str, list), [])
        value = [value] if isinstance(value, str) else value
        for v in value:
            if not isinstance(v, str):
                raise self.error(
                    f"expected column names (strings), got {v!r}.", *key, name
                )
        return list(value)

    def _check_keys(self, table: dict, allowed: set[str], key: tuple) -> None:
        for name in table:
            if name not in allowed:
                hint = difflib.get_close_matches(name, sorted(allowed), n=1)
                extra = f" Did you mean {hint[0]!r}?" if hint else ""
                raise self.error(
                    f"unknown key {name!r}; allowed: {sorted(allowed)}.{extra}",
                    *key,
                    name,
                )

    # --------------------------------------------------------------- parts
    @property
    def tables(self) -> dict[str, dict[str, Any]]:
        return self.data.get("tables", {})

    @property
    def joins(self) -> list[dict[str, Any]]:
        return self.data.get("joins", [])

    @property
    def base(self) -> str:
        return self.data.get("base") or next(iter(self.tables))

    def validate(self) -> FitSpec:
        """Check the structure (keys, types, names) without reading any data."""
        check_spec(self)
        return self

    @staticmethod
    def estimator_names() -> list[str]:
        return estimator_names()

    # --------------------------------------------------------------- estimator
    def estimator_class(self) -> type:
        import importlib

        module, cls = ESTIMATORS[estimator_key(self.data["estimator"]["name"])]
        return getattr(importlib.import_module(module), cls)

    @property
    def plan(self) -> str:
        return self.data["estimator"].get("plan", "auto")

    def make_estimator(self, plan: str | None = None) -> Any:
        """The estimator of the spec (a pipeline with the scaler when ``scale``).

        Parameters
        ----------
        plan : {"auto", "factorized", "materialized"}, optional
            Overrides the spec's plan. With "auto" the estimator is wrapped in an
            :class:`~ilargi_sklearn.AutoPlan`, which chooses the plan at ``fit``.
        """
        from sklearn.pipeline import make_pipeline

        from ilargi_sklearn.planner import AutoPlan
        from ilargi_sklearn.preprocessing import FactorizedStandardScaler

        est_spec = self.data["estimator"]
        cls = self.estimator_class()
        est = cls()
        params = dict(est_spec.get("params", {}))
        valid = est.get_params(deep=False)
        for name in params:
            if name == "strategy":
                raise self.error(
                    'set the plan with plan = "factorized" | "materialized" | '
                    '"auto" in [estimator], not with params.strategy.',
                    "estimator",
                    "params",
                    name,
                )
            if name not in valid:
                hint = difflib.get_close_matches(name, list(valid), n=1)
                extra = f" Did you mean {hint[0]!r}?" if hint else ""
                raise self.error(
                    f"{cls.__name__} has no parameter {name!r}; its parameters: "
                    f"{sorted(p for p in valid if p != 'strategy')}.{extra}",
                    "estimator",
                    "params",
                    name,
                )
        est.set_params(**params)
        self._check_params(est)
        plan = plan or self.plan
        if plan in ("factorized", "materialized"):
            est.set_params(strategy=plan)
        else:
            est = AutoPlan(est)
        if est_spec.get("scale", False):
            est = make_pipeline(FactorizedStandardScaler(), est)
        return est

    def _check_params(self, est: Any) -> None:
        """Check parameter values now, before any data is read."""
        from sklearn.utils._param_validation import InvalidParameterError

        try:
            est._validate_params()
        except InvalidParameterError as exc:
            m = re.search(r"The '([^']+)' parameter", str(exc))
            key = ("estimator", "params") + ((m.group(1),) if m else ())
            raise self.error(str(exc), *key) from None

    @property
    def task(self) -> str:
        from sklearn.base import is_classifier, is_regressor

        est = self.estimator_class()()
        if is_classifier(est):
            return "classification"
        if is_regressor(est):
            return "regression"
        return "unsupervised"

    # --------------------------------------------------------------- data
    def with_tables(self, paths: dict[str, str]) -> FitSpec:
        """The same spec reading other files for some tables (new rows to score).

        Parameters
        ----------
        paths : dict of {table name: path}
            Paths relative to the current folder, not to the spec's.
        """
        unknown = [n for n in paths if n not in self.tables]
        if unknown:
            raise self.error(
                f"tables {unknown} are not defined in the spec; its tables: "
                f"{list(self.tables)}.",
                "tables",
            )
        data = {**self.data, "tables": {n: dict(t) for n, t in self.tables.items()}}
        for name, path in paths.items():
            data["tables"][name]["path"] = str(Path(path).expanduser().resolve())
            data["tables"][name].pop("format", None)
        return FitSpec(self.path, data, self.text)

    def _table_path(self, name: str) -> Path:
        raw = self.tables[name]["path"]
        p = Path(raw).expanduser()
        return p if p.is_absolute() else (self.path.parent / p)

    def _needed_columns(self, target: bool = True) -> dict[str, list[str]]:
        """Columns each table must provide (keys, features, and the target)."""
        need: dict[str, list[str]] = {n: [] for n in self.tables}
        names = {self.base: self.base}
        for name, t in self.tables.items():
            need[name] += self._names(t, "numeric", ("tables", name))
            need[name] += self._names(t, "categorical", ("tables", name))
        for i, j in enumerate(self.joins, start=1):
            names[j.get("name", j["table"])] = j["table"]
            lk, rk = self._join_keys(i, j)
            left_table = names[j.get("via", self.base)]
            need[left_table] += lk
            need[j["table"]] += [k for k in rk if k != ROW_NUMBER]
            need[j["table"]] += self._names(j, "numeric", ("joins", i))
            need[j["table"]] += self._names(j, "categorical", ("joins", i))
        spec_target = self.data.get("target")
        if spec_target and target:
            need[self.base].append(spec_target["column"])
        return {k: list(dict.fromkeys(v)) for k, v in need.items()}

    def _join_keys(self, i: int, j: dict) -> tuple[list[str], list[str]]:
        key = ("joins", i)
        table_key = self._names(self.tables[j["table"]], "key", ("tables", j["table"]))
        if "row_number" in j:
            lk = self._names(j, "left_on", key)
            if len(lk) != 1:
                raise self.error(
                    f"a row-number join takes one left_on column, got {lk}.",
                    *key,
                    "left_on",
                )
            return lk, [ROW_NUMBER]
        if "on" in j:
            on = self._names(j, "on", key)
            return on, on
        if "left_on" in j:
            lk = self._names(j, "left_on", key)
            rk = self._names(j, "right_on", key) if "right_on" in j else table_key
            if not rk:
                raise self.error(
                    f"left_on is given but neither right_on nor a key for table "
                    f"{j['table']!r}; add right_on = ... or key = ... to "
                    f"[tables.{j['table']}].",
                    *key,
                    "left_on",
                )
            if len(lk) != len(rk):
                raise self.error(
                    f"left_on {lk} and the right key {rk} have different lengths.",
                    *key,
                    "left_on",
                )
            return lk, rk
        if "right_on" in j:
            raise self.error("right_on needs left_on.", *key, "right_on")
        if not table_key:
            raise self.error(
                f'say how to join {j["table"]!r}: on = "COLUMN" (same name on both '
                "sides), left_on = ... (the table's key is the right side), or key = "
                f"... in [tables.{j['table']}].",
                *key,
            )
        return table_key, table_key

    def read_tables(
        self,
        console: Console | None = None,
        *,
        target: bool = True,
        extra: dict[str, list[str]] | None = None,
    ) -> dict[str, Any]:
        """Read every table (only the columns the spec uses); check the columns.

        Parameters
        ----------
        target : bool, default=True
            Whether the base table must have the target column (not to score).
        extra : dict of {table: columns}, optional
            More columns to read (to write next to predictions).
        """

        need = self._needed_columns(target)
        for name, cols in (extra or {}).items():
            need[name] = list(dict.fromkeys(need[name] + list(cols)))
        frames: dict[str, Any] = {}
        bar = console.progress(len(self.tables), "reading tables") if console else None
        try:
            for name in self.tables:
                frames[name] = self._read_table(name, need[name])
                if bar is not None:
                    bar.advance(note=name)
        finally:
            if bar is not None:
                bar.close()
        return frames

    def _read_table(self, name: str, columns: list[str]) -> Any:
        t = self.tables[name]
        path = self._table_path(name)
        key = ("tables", name, "path")
        if not path.is_file():
            raise self.error(
                f"file {t['path']!r} not found (looked for {str(path.resolve())!r}; "
                "paths are relative to the spec file).",
                *key,
            )
        from ilargi_sklearn.dataset._interop import (
            MalformedRowError,
            MissingColumnsError,
            read_table,
        )

        try:
            frame = read_table(
                path, columns, fmt=t.get("format"), sep=t.get("sep", ",")
            )
        except MissingColumnsError as exc:
            col = exc.missing[0]
            header = [str(h) for h in exc.columns]
            hint = difflib.get_close_matches(col, header, n=1)
            extra = f" Did you mean {hint[0]!r}?" if hint else ""
            raise self.error(
                f"column {col!r} not found in {t['path']!r} (table {name!r}); its "
                f"columns are {header}.{extra}",
                *self._where_column(name, col),
            ) from None
        except MalformedRowError as exc:
            raise self.error(str(exc), *key) from None
        except ImportError as exc:
            raise self.error(
                f"reading Parquet needs pyarrow ({exc}); pip install pyarrow, or "
                "convert the table to CSV.",
                *key,
            ) from None
        except Exception as exc:  # noqa: BLE001 - any reader failure is the file's
            raise self.error(
                f"cannot read {t['path']!r}: {type(exc).__name__}: {exc}", *key
            ) from None
        if len(frame) == 0:
            raise self.error(f"table {name!r} ({t['path']!r}) has no rows.", *key)
        for col, kind in t.get("cast", {}).items():
            if col in frame.columns:
                frame[col] = self._cast(frame[col], kind, ("tables", name, "cast", col))
        return frame

    def _cast(self, s: Any, kind: str, key: tuple[Any, ...]) -> Any:
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
            s.astype("str").str.strip()
            if not pd.api.types.is_numeric_dtype(s.dtype)
            else s
        )
        num = pd.to_numeric(text, errors="coerce")
        bad = num.isna() & s.notna()
        if bad.any():
            raise self.error(
                f"cannot cast column {s.name!r} to {kind}: values such as "
                f"{s[bad].head(3).tolist()} are not numbers.",
                *key,
            )
        if kind == "float":
            return num.astype("float64")
        whole = num.dropna()
        if not (whole == whole.round()).all():
            raise self.error(
                f"cannot cast column {s.name!r} to int: values such as "
                f"{whole[whole != whole.round()].head(3).tolist()} are not whole "
                'numbers; cast it to "float".',
                *key,
            )
        # Nullable integers keep gaps as missing values instead of turning floats.
        return num.astype("Int64") if num.isna().any() else num.astype("int64")

    def _where_column(self, table: str, col: str) -> tuple[Any, ...]:
        """The spec key that asks table ``table`` for column ``col``."""
        t = self.tables[table]
        for k in ("numeric", "categorical", "key"):
            if col in self._names(t, k, ("tables", table)):
                return ("tables", table, k)
        target = self.data.get("target") or {}
        if table == self.base and target.get("column") == col:
            return ("target", "column")
        names = {self.base: self.base}
        for i, j in enumerate(self.joins, start=1):
            names[j.get("name", j["table"])] = j["table"]
            left_table = names[j.get("via", self.base)]
            for k in ("on", "left_on", "right_on", "numeric", "categorical"):
                if col not in self._names(j, k, ("joins", i)):
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

    def build(
        self,
        console: Console | None = None,
        *,
        n_rows: int | None = None,
        schema: Any = None,
        handle_unknown: str = "warn",
    ) -> tuple[Any, Any, dict[str, Any]]:
        """Read the tables and build the dataset and the target.

        Parameters
        ----------
        console : Console, optional
            For progress bars.
        n_rows : int, optional
            Keep only the first ``n_rows`` rows of the base table.
        schema : DatasetSchema, optional
            Encode with a trained model's schema (``DatasetSchema.of(model)``) to
            score new rows: the base table needs no target column, and the result
            has exactly the training features.
        handle_unknown : {"warn", "ignore", "error"}, default="warn"
            With ``schema``: categories the training data did not have.

        Returns
        -------
        dataset : MultiSourceDataset
        y : ndarray or None
            The target in dataset order (None without a ``[target]`` section or
            with ``schema``). Joins may drop base rows (inner) or repeat them (one
            to many): the target follows them.
        info : dict
            Timings and row counts.
        """
        t0 = time.perf_counter()
        frames = self.read_tables(console, target=schema is None)
        read_seconds = time.perf_counter() - t0
        ds, y, info = self.build_from(
            frames, n_rows=n_rows, schema=schema, handle_unknown=handle_unknown
        )
        return ds, y, {"read_seconds": read_seconds, **info}

    def build_from(
        self,
        frames: dict[str, Any],
        *,
        n_rows: int | None = None,
        schema: Any = None,
        handle_unknown: str = "warn",
    ) -> tuple[Any, Any, dict[str, Any]]:
        """:meth:`build` from tables already read (:meth:`read_tables`)."""
        from ilargi_sklearn.dataset import Join, from_frames

        info: dict[str, Any] = {}
        base = frames[self.base]
        target = self.data.get("target") if schema is None else None
        if target:
            col = target["column"]
            keep = base[col].notna().to_numpy()
            info["rows_without_target"] = int((~keep).sum())
            if not keep.any():
                raise self.error(
                    f"target column {col!r} has no values.", "target", "column"
                )
            if not keep.all():
                base = base[keep].reset_index(drop=True)
        if n_rows is not None:
            base = base.iloc[: int(n_rows)].reset_index(drop=True)
        bt = self.tables[self.base]
        joins, labels = [], {}
        for i, j in enumerate(self.joins, start=1):
            t = self.tables[j["table"]]
            key = ("joins", i)
            lk, rk = self._join_keys(i, j)
            name = j.get("name", j["table"])
            labels[name] = key
            # A join's numeric/categorical lists replace the table's, one by one.
            numeric = self._names(j if "numeric" in j else t, "numeric", key)
            categorical = self._names(
                j if "categorical" in j else t, "categorical", key
            )
            self._check_numeric(
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
                )
            )
        t0 = time.perf_counter()
        base_num = self._names(bt, "numeric", ("tables", self.base))
        base_cat = self._names(bt, "categorical", ("tables", self.base))
        self._check_numeric(base, base_num, ("tables", self.base), self.base)
        min_match = self.data.get("min_match", DEFAULT_MIN_MATCH)
        try:
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
                    base_name=self.base,
                    base_categorical=base_cat,
                    base_impute=bt.get("impute"),
                    dtype=self.data.get("dtype", "float64"),
                    min_match=min_match,
                    target=target["column"] if target else None,
                )
        except (ValueError, TypeError) as exc:
            raise self._locate_build_error(str(exc), labels) from None
        info["build_seconds"] = time.perf_counter() - t0
        if y is not None:
            # Rows an outer join added come from no base row: they have no target.
            orphans = ds.base_rows_ < 0
            if orphans.any():
                info["rows_without_base_row"] = int(orphans.sum())
                ds, y = ds[~orphans], y[~orphans]
            y = self._target_values(y.to_numpy(), target)
        info["n_rows"] = int(ds.shape[0])
        info["n_base_rows"] = int(len(base))
        return ds, y, info

    def _target_values(self, y: np.ndarray, target: dict[str, Any]) -> np.ndarray:
        if "threshold" not in target:
            return y
        try:
            return (y.astype(np.float64) > float(target["threshold"])).astype(np.int64)
        except (TypeError, ValueError):
            raise self.error(
                f"threshold needs a numeric target; column {target['column']!r} "
                f"holds {y.dtype} values.",
                "target",
                "threshold",
            ) from None

    def _check_numeric(
        self, frame: Any, columns: list[str], key: tuple[Any, ...], table: str
    ) -> None:
        import pandas as pd

        for col in columns:
            s = frame[col]
            if not (
                pd.api.types.is_numeric_dtype(s.dtype)
                or pd.api.types.is_bool_dtype(s.dtype)
            ):
                example = s.dropna().iloc[0] if s.notna().any() else None
                raise self.error(
                    f"column {col!r} of table {table!r} is listed as numeric but holds "
                    f"{s.dtype} values (e.g. {example!r}); list it under categorical, "
                    "or fix the file.",
                    *key,
                    "numeric",
                )

    def _table_of(self, source: str) -> str:
        """The table behind a source name (a join's name, or the base)."""
        for j in self.joins:
            if j.get("name", j["table"]) == source:
                return j["table"]
        return source

    def _locate_build_error(self, msg: str, labels: dict[str, tuple]) -> SpecError:
        if "impute" in msg:
            msg += (
                ' In the spec: impute = "mean" (or "zero", "median", "joined_mean", '
                "a number) in the table's [tables.NAME] section or in its [[joins]] "
                "entry."
            )
        m = re.search(r"(\w+)\.(\w+) holds numbers stored as text", msg)
        if m:
            table = self._table_of(m.group(1))
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
                    return self.error(msg, *key)
        for pattern in (f"source {self.base!r}", f"table {self.base!r}"):
            if pattern in msg:
                return self.error(msg, "tables", self.base)
        return self.error(msg, "joins")


def load_spec(path: str | os.PathLike) -> FitSpec:
    """Read and check a fit spec (TOML).

    Parameters
    ----------
    path : str or path-like
        The spec file.

    Returns
    -------
    FitSpec
        Call :meth:`FitSpec.build` for the dataset and target,
        :meth:`FitSpec.make_estimator` for the estimator.

    Raises
    ------
    SpecError
        The file is missing, is not valid TOML, or the spec is inconsistent; the
        error carries the file, the key and the line.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from ilargi_sklearn.cli import SpecError, load_spec
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "bad.toml"
    >>> _ = f.write_text('[tables.t]\\npath = "t.csv"\\n[estimator]\\nname = "SVM"\\n')
    >>> try:
    ...     load_spec(f)
    ... except SpecError as e:
    ...     print(e.line, e.key, e.message.split(";")[0])
    4 ('estimator', 'name') unknown estimator 'SVM'
    """
    path = Path(path)
    data, text = read_toml(path)
    return FitSpec(path, data, text).validate()
