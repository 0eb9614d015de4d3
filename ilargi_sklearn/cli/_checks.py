"""The vocabulary of a fit spec and the check of its structure.

:func:`check_spec` reads no data: it checks the keys, types and names of each
section in turn (tables, base and dtype, joins, target, estimator,
cross-validation) and stops at the first problem. The spec
(:class:`~ilargi_sklearn.cli.FitSpec`) provides the located errors and the typed
getters it uses.
"""

from __future__ import annotations

import difflib
from typing import Any

from ilargi_sklearn._backend._plan import STRATEGIES
from ilargi_sklearn.multisource._builder import VALIDATE


def _package_estimators() -> dict[str, tuple[str, str]]:
    """The estimators a spec may name: every public ``Factorized*`` model of the
    package (read from ``ilargi_sklearn.__all__``, so that a new estimator is
    accepted, and listed in errors, without an edit here), by :func:`estimator_key`.

    Not the preprocessing steps (``FactorizedStandardScaler`` is ``scale = true``;
    ``FactorizedPolynomialFeatures`` makes a dataset, not a model) nor
    ``AutoPlan`` (``plan = "auto"``)."""
    import inspect

    import ilargi_sklearn

    out = {}
    for name in sorted(ilargi_sklearn.__all__):
        obj = getattr(ilargi_sklearn, name)
        if not (inspect.isclass(obj) and name.startswith("Factorized")):
            continue
        if obj.__module__.startswith("ilargi_sklearn.preprocessing"):
            continue
        out[estimator_key(name)] = ("ilargi_sklearn", name)
    return out


#: The values of a spec's ``plan`` (the planner, or one strategy).
PLAN_CHOICES = ("auto", *STRATEGIES)
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
    "strip",
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
    "validate",
}
_TARGET_KEYS = {"column", "threshold"}
_ESTIMATOR_KEYS = {"name", "params", "scale", "plan"}
_CV_KEYS = {"folds", "scoring", "shuffle", "random_state"}


def estimator_key(name: str) -> str:
    """The :data:`ESTIMATORS` key of a name (``FactorizedKMeans``, ``k_means``)."""
    k = name.lower().replace("_", "").replace("-", "")
    return k[len("factorized") :] if k.startswith("factorized") else k


def estimator_names() -> list[str]:
    """The class names a spec's ``[estimator] name`` may take."""
    return [cls for _, cls in ESTIMATORS.values()]


def classifier_names() -> list[str]:
    """The classifiers among :func:`estimator_names` (for error messages)."""
    import importlib

    from sklearn.base import is_classifier

    return [
        cls
        for module, cls in ESTIMATORS.values()
        if is_classifier(getattr(importlib.import_module(module), cls)())
    ]


#: The estimators of a spec's ``[estimator] name``, by :func:`estimator_key`.
ESTIMATORS = _package_estimators()


def check_spec(spec: Any) -> None:
    """Check the structure of ``spec.data`` (keys, types, names) without reading data.

    Raises
    ------
    SpecError
        At the first problem, with its key and line.
    """
    d = spec.data
    spec._check_keys(d, _TOP_KEYS, ())
    tables = _check_tables(spec, d)
    base = spec._get(d, "base", (), (str,))
    if base is not None and base not in tables:
        raise spec.error(
            f"base {base!r} is not a table; tables: {list(tables)}.", "base"
        )
    dtype = spec._get(d, "dtype", (), (str,), "float64")
    if dtype not in ("float64", "float32"):
        raise spec.error(
            f"dtype must be 'float64' or 'float32', got {dtype!r}.", "dtype"
        )
    _check_joins(spec, d, tables)
    _check_fraction(spec, d, ())
    _check_target(spec, d)
    _check_estimator(spec, d)
    _check_cv(spec, d)


def _check_tables(spec: Any, d: dict[str, Any]) -> dict[str, Any]:
    tables = spec._get(d, "tables", (), (dict,))
    if not tables:
        raise spec.error(
            "the spec names no tables: add a [tables.NAME] section with a path."
        )
    for name, t in tables.items():
        if not isinstance(t, dict):
            raise spec.error(
                f"expected a table ([tables.{name}]), got {t!r}.", "tables", name
            )
        key = ("tables", name)
        spec._check_keys(t, _TABLE_KEYS, key)
        if "path" not in t:
            raise spec.error(f"table {name!r} needs a path.", *key)
        spec._get(t, "path", key, (str,))
        fmt = spec._get(t, "format", key, (str,))
        if fmt is not None and fmt not in ("csv", "parquet"):
            raise spec.error(
                f"format must be 'csv' or 'parquet', got {fmt!r}.", *key, "format"
            )
        spec._names(t, "key", key)
        spec._names(t, "numeric", key)
        spec._names(t, "categorical", key)
        spec._names(t, "strip", key)
        _check_impute(spec, t, key)
        spec._get(t, "sep", key, (str,))
        cast = spec._get(t, "cast", key, (dict,), {})
        for col, kind in cast.items():
            if kind not in CASTS:
                raise spec.error(
                    f"cast of column {col!r} must be one of {list(CASTS)}, got "
                    f"{kind!r}.",
                    *key,
                    "cast",
                    col,
                )
    return tables


def _check_joins(spec: Any, d: dict[str, Any], tables: dict[str, Any]) -> None:
    joins = spec._get(d, "joins", (), (list,), [])
    seen = {spec.base}
    for i, j in enumerate(joins, start=1):
        key = ("joins", i)
        if not isinstance(j, dict):
            raise spec.error("each join must be a [[joins]] table.", *key)
        spec._check_keys(j, _JOIN_KEYS, key)
        table = spec._get(j, "table", key, (str,))
        if table is None:
            raise spec.error('a join needs table = "NAME".', *key)
        if table not in tables:
            hint = difflib.get_close_matches(table, list(tables), n=1)
            extra = f" Did you mean {hint[0]!r}?" if hint else ""
            raise spec.error(
                f"table {table!r} is not defined; tables: {list(tables)}.{extra}",
                *key,
                "table",
            )
        name = spec._get(j, "name", key, (str,), table)
        if name in seen:
            raise spec.error(
                f"source name {name!r} is used twice; give this join a distinct "
                'name = "..." (a table joined twice needs one per join).',
                *key,
                "name" if "name" in j else "table",
            )
        via = spec._get(j, "via", key, (str,))
        if via is not None and via not in seen:
            raise spec.error(
                f"via {via!r} names no earlier join; earlier: {sorted(seen)}.",
                *key,
                "via",
            )
        seen.add(name)
        how = spec._get(j, "how", key, (str,), "left")
        if how not in ("inner", "left", "outer"):
            raise spec.error(
                f"how must be 'inner', 'left' or 'outer', got {how!r}.", *key, "how"
            )
        for k in ("on", "left_on", "right_on", "numeric", "categorical"):
            spec._names(j, k, key)
        if "on" in j and ("left_on" in j or "right_on" in j):
            raise spec.error("give either on or left_on/right_on, not both.", *key)
        if spec._get(j, "row_number", key, (int,)) is not None and (
            "left_on" not in j or "on" in j or "right_on" in j
        ):
            raise spec.error(
                "row_number joins left_on against the table's row number (1 for "
                "1-based row numbers): give left_on and no on or right_on.",
                *key,
                "row_number",
            )
        _check_impute(spec, j, key)
        spec._get(j, "indicator", key, (bool,))
        spec._get(j, "nulls_equal", key, (bool,))
        validate = spec._get(j, "validate", key, (str,))
        if validate is not None and validate not in VALIDATE:
            raise spec.error(
                f"validate must be one of {sorted(set(VALIDATE.values()))} (or "
                f"pandas' short forms '1:1', '1:m', 'm:1', 'm:m'), got {validate!r}.",
                *key,
                "validate",
            )
        _check_fraction(spec, j, key)


def _check_target(spec: Any, d: dict[str, Any]) -> None:
    target = spec._get(d, "target", (), (dict,))
    if target is not None:
        spec._check_keys(target, _TARGET_KEYS, ("target",))
        if spec._get(target, "column", ("target",), (str,)) is None:
            raise spec.error('the target needs column = "NAME".', "target")
        spec._get(target, "threshold", ("target",), (int, float))


def _check_estimator(spec: Any, d: dict[str, Any]) -> None:
    est = spec._get(d, "estimator", (), (dict,))
    if est is None:
        raise spec.error(
            "the spec has no [estimator] section; add one with name = "
            f"one of {estimator_names()}."
        )
    spec._check_keys(est, _ESTIMATOR_KEYS, ("estimator",))
    name = spec._get(est, "name", ("estimator",), (str,))
    if name is None:
        raise spec.error(
            f"the estimator needs a name: one of {estimator_names()}.",
            "estimator",
        )
    if estimator_key(name) not in ESTIMATORS:
        hint = difflib.get_close_matches(estimator_key(name), list(ESTIMATORS), n=1)
        extra = f" Did you mean {ESTIMATORS[hint[0]][1]!r}?" if hint else ""
        raise spec.error(
            f"unknown estimator {name!r}; known: {estimator_names()}.{extra}",
            "estimator",
            "name",
        )
    spec._get(est, "params", ("estimator",), (dict,))
    spec._get(est, "scale", ("estimator",), (bool,))
    plan = spec._get(est, "plan", ("estimator",), (str,), "auto")
    if plan not in PLAN_CHOICES:
        raise spec.error(
            f"plan must be one of {list(PLAN_CHOICES)}, got {plan!r}.",
            "estimator",
            "plan",
        )


def _check_cv(spec: Any, d: dict[str, Any]) -> None:
    cv = spec._get(d, "cv", (), (dict,), {})
    spec._check_keys(cv, _CV_KEYS, ("cv",))
    folds = spec._get(cv, "folds", ("cv",), (int,), 5)
    if folds == 1 or folds < 0:
        raise spec.error(
            f"folds must be 0 (no cross-validation) or >= 2, got {folds}.",
            "cv",
            "folds",
        )
    scoring = spec._get(cv, "scoring", ("cv",), (str,))
    if scoring is not None:
        from sklearn.metrics import get_scorer_names

        if scoring not in get_scorer_names():
            hint = difflib.get_close_matches(scoring, get_scorer_names(), n=3)
            raise spec.error(
                f"unknown scoring {scoring!r}"
                + (f"; did you mean one of {hint}?" if hint else "."),
                "cv",
                "scoring",
            )
    spec._get(cv, "shuffle", ("cv",), (bool,))
    spec._get(cv, "random_state", ("cv",), (int,))


def _check_impute(spec: Any, t: dict, key: tuple) -> None:
    imp = spec._get(t, "impute", key, (str, int, float))
    if isinstance(imp, str) and imp not in _IMPUTES:
        raise spec.error(
            f"impute must be one of {list(_IMPUTES)} or a number, got {imp!r}.",
            *key,
            "impute",
        )


def _check_fraction(spec: Any, t: dict, key: tuple) -> None:
    m = spec._get(t, "min_match", key, (int, float))
    if m is not None and not 0 <= m <= 1:
        raise spec.error(
            f"min_match must be a fraction in [0, 1], got {m!r}.", *key, "min_match"
        )
