"""A fit spec: the TOML file that ``ilargi fit`` reads, checked and turned into a
dataset and an estimator.

:func:`load_spec` reads a spec (:mod:`~ilargi_sklearn.cli._toml`) and checks its
structure (:mod:`~ilargi_sklearn.cli._checks`); :class:`FitSpec` builds its
estimator, and reads its tables and builds the dataset and the target
(:mod:`~ilargi_sklearn.cli._tables`). Every problem is a :class:`SpecError` at the
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

from ilargi_sklearn.cli._checks import (
    ESTIMATORS,
    check_spec,
    estimator_key,
    estimator_names,
)
from ilargi_sklearn.cli._tables import build_dataset, read_tables
from ilargi_sklearn.cli._toml import SpecError, find_line, read_toml
from ilargi_sklearn.multisource._builder import ROW_NUMBER

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

    def _join_keys(self, i: int, j: dict) -> tuple[list[str], list[str]]:
        """The left and right key columns of join ``j``, the ``i``-th."""
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
                    f"[tables.{j['table']}], or row_number = 1 to this join if "
                    f"{lk[0]!r} numbers the rows of {j['table']!r} (1 for its first "
                    "row; 0 for positions).",
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
        return read_tables(self, console, target=target, extra=extra)

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
        return build_dataset(
            self, frames, n_rows=n_rows, schema=schema, handle_unknown=handle_unknown
        )


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
