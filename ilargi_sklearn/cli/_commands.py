"""The commands ``demo``, ``fit``, ``predict`` and ``calibrate``.

Each command is a function ``cmd_NAME(args, console) -> exit code`` of the parsed
arguments (:mod:`ilargi_sklearn.cli._parser`); spec problems raise
:class:`SpecError` (exit code 2) and failures while running :class:`RunError`
(exit code 1), which :func:`ilargi_sklearn.cli.main` turns into one line on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ilargi_sklearn.cli._console import (
    EXIT_OK,
    Console,
    RunError,
    UsageError,
    emit_json,
    json_default,
    plain,
)
from ilargi_sklearn.cli._cv import (
    cross_validate_progress,
    plan_info,
    strategy_of,
    summarize_plans,
)
from ilargi_sklearn.cli._spec import FitSpec, load_spec
from ilargi_sklearn.cli._toml import SpecError
from ilargi_sklearn.multisource._builder import format_fraction


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from ilargi_sklearn.cli._demo import run_demo

    report = run_demo(
        console,
        n_rows=args.n_rows,
        cv=args.cv,
        chart=None if args.no_chart else args.chart,
        baseline=not args.no_baseline,
    )
    if console.json:
        emit_json(console, report)
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
            console.note(f"note: {flag_spelling(str(w.message))}")


def flag_spelling(text: str) -> str:
    """A library message with its Python parameters spelled as the command
    line's flags: ``handle_unknown='ignore'`` as ``--handle-unknown ignore``."""
    if "handle_unknown=" not in text:
        return text
    text = re.sub(r"handle_unknown='(\w+)'", r"--handle-unknown \1", text)
    # "handle_unknown='warn' or 'ignore'": the values named after the first.
    return re.sub(r"(?<=or )'(warn|ignore|error)'", r"--handle-unknown \1", text)


def _print_joins(console: Console, ds: Any) -> list[dict[str, Any]]:
    """One line per join: rows matched, with the digits the rate needs."""
    report = ds.match_report_
    if report is None or report.empty:
        return []
    rows = []
    for name, r in report.iterrows():
        null = f", {r['null_keys']:,} missing keys" if r["null_keys"] else ""
        fan = (
            f", repeats rows: {r['fan_out']:.3g} per matched row, "
            f"{r['rows']:,} -> {r['rows_out']:,} rows"
            if r["fan_out"] > 1
            else ""
        )
        console.info(
            f"join {name} ({r['how']}): matched {r['matched']:,} of {r['rows']:,} "
            f"rows ({format_fraction(r['fraction'])}){null}{fan}"
        )
        rows.append({"join": str(name), **{k: plain(v) for k, v in r.items()}})
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
    est = spec.make_estimator(plan)
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
    console.info(desc.sources.to_string(float_format=lambda v: f"{v:.3g}"))
    console.info(
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
            "summary": {k: plain(v) for k, v in s.items()},
            "sources": {
                str(n): {k: plain(v) for k, v in row.items()}
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
        "plan": {"requested": plan},
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
        report["plan"].update({"plan": plan, "strategy": strategy_of(plan)})

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
        # ilargi predict checks it: a damaged file can unpickle as another model.
        report["model_sha256"] = hashlib.sha256(model_path.read_bytes()).hexdigest()
        report["model_path"] = str(model_path)
        report["report_path"] = str(report_path)
        report_path.write_text(
            json.dumps(report, indent=2, default=json_default) + "\n", encoding="utf-8"
        )
        console.result(f"model saved to {model_path}")
        console.result(f"report saved to {report_path}")
    if console.json:
        emit_json(console, report)
    return EXIT_OK


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
def _report_of(model: Path) -> tuple[Path, dict[str, Any] | None]:
    """The report ``ilargi fit`` wrote next to a model, and its content (None when
    it is missing or unreadable)."""
    report = model.with_name(model.name.removesuffix(".joblib") + ".report.json")
    try:
        doc = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return report, None
    return report, doc if isinstance(doc, dict) else None


def _model_spec(args: argparse.Namespace) -> Path:
    """The spec of a saved model: --spec, or the one its report names."""
    if args.spec is not None:
        return Path(args.spec)
    model = Path(args.model)
    report, doc = _report_of(model)
    named = (doc or {}).get("spec")
    if named:
        return Path(named)
    raise UsageError(
        f"no spec for {model}: pass --spec SPEC (the report {report.name}, which "
        "names it, is missing or names none)."
    )


def _damaged(path: Path, why: str) -> UsageError:
    return UsageError(
        f"{str(path)!r} is not a readable model file: truncated or damaged? re-run "
        f"ilargi fit ({why})"
    )


def load_model(path: Path) -> Any:
    """The estimator a model file of ``ilargi fit`` holds, checked.

    The checksum its report records (``model_sha256``) must match, and the file
    must unpickle: a damaged file otherwise raises from deep inside pickle, or
    loads as a different model.

    Raises
    ------
    UsageError
        The file is missing, damaged, or holds no fitted estimator.
    """
    import joblib

    if not path.is_file():
        raise UsageError(f"model file {str(path)!r} not found.")
    report, doc = _report_of(path)
    expected = (doc or {}).get("model_sha256")
    if expected and hashlib.sha256(path.read_bytes()).hexdigest() != expected:
        raise _damaged(
            path,
            f"its SHA-256 differs from the one {report.name} recorded; a model "
            "replaced on purpose needs its report deleted, and --spec",
        )
    try:
        model = joblib.load(path)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is the file's
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise _damaged(path, f"{type(exc).__name__}: {first}".rstrip(": ")) from None
    if not (hasattr(model, "predict") or hasattr(model, "transform")):
        raise UsageError(
            f"{str(path)!r} holds a {type(model).__name__}, not a fitted model: pass "
            "a model saved by 'ilargi fit' (SPEC_STEM.joblib)."
        )
    return model


def _parse_tables(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--table takes NAME=PATH, got {item!r}.")
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


def _read_keeping(
    spec: FitSpec, console: Console, keep: list[str], asked: bool
) -> dict[str, Any]:
    """The tables to score, with the base columns ``keep`` (``--keep`` when
    ``asked``: a column it names that is missing is the option's error)."""
    try:
        return spec.read_tables(console, target=False, extra={spec.base: keep})
    except SpecError as exc:
        m = re.match(r"column '([^']+)' not found in (.*)", exc.message)
        if not (asked and m and m.group(1) in keep):
            raise
        raise UsageError(
            f"--keep: column {m.group(1)!r} not found in {m.group(2)}"
        ) from None


def _more_rows_note(ds: Any, n_rows: int, n_base_rows: int) -> str:
    """Why the predictions have more rows than the base table: the joins."""
    report = ds.match_report_
    causes = []
    if report is not None:
        for name, r in report.iterrows():
            if r["fan_out"] > 1:
                causes.append(
                    f"join {name} repeats base rows (keys such as "
                    f"{list(r['repeated_keys'])[:3]} occur more than once in its table)"
                )
            elif r["how"] == "outer" and r["rows_out"] > r["rows"]:
                causes.append(f"outer join {name} adds rows of its table")
    why = ": " + "; ".join(causes) if causes else ""
    return (
        f"note: writing {n_rows:,} predictions for {n_base_rows:,} base rows{why}. "
        "The base_row column gives each prediction's base row (-1: none); a join "
        "that should keep one row per base row needs a table with unique keys."
    )


def cmd_predict(args: argparse.Namespace, console: Console) -> int:
    import pandas as pd

    from ilargi_sklearn.multisource import DatasetSchema

    t_start = time.perf_counter()
    model_path = Path(args.model)
    tables = _parse_tables(args.table)
    model = load_model(model_path)
    schema = DatasetSchema.of(model)
    if schema is None:
        raise UsageError(
            f"{model_path} holds a {type(model).__name__} fitted without a dataset "
            "schema (on an array, or by an older version): refit it with "
            "'ilargi fit' to score new tables."
        )
    spec = load_spec(_model_spec(args))
    if tables:
        spec = spec.with_tables(tables)
    keep = args.keep.split(",") if args.keep else _key_columns(spec)
    t0 = time.perf_counter()
    frames = _read_keeping(spec, console, keep, bool(args.keep))
    read_seconds = time.perf_counter() - t0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds, _, info = spec.build_from(
                frames, schema=schema, handle_unknown=args.handle_unknown
            )
        except SpecError as exc:
            if "categories the training data did not have" not in exc.message:
                raise
            # The data, not the spec: the flag asked for an error.
            raise RunError(flag_spelling(exc.message)) from None
    _note_warnings(console, caught)
    info["read_seconds"] = read_seconds
    console.info(
        f"{info['n_rows']:,} rows to score from {info['n_base_rows']:,} base rows "
        f"(read {info['read_seconds']:.2f} s, built {info['build_seconds']:.2f} s)"
    )
    joins_report = _print_joins(console, ds)
    if info["n_rows"] > info["n_base_rows"]:
        console.note(_more_rows_note(ds, info["n_rows"], info["n_base_rows"]))
    t0 = time.perf_counter()
    out = pd.DataFrame({"base_row": ds.base_rows_})
    base = frames[spec.base]
    rows = ds.base_rows_
    for col in keep:
        # Rows an outer join added have no base row (-1): their keys are missing.
        values = base[col].iloc[np.maximum(rows, 0)].reset_index(drop=True)
        out[col] = values if rows.min(initial=0) >= 0 else values.where(rows >= 0)
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
        emit_json(
            console,
            {
                "command": "predict",
                "model_path": str(model_path),
                "spec": str(spec.path),
                "out": str(dest),
                "n_rows": len(out),
                "n_base_rows": info["n_base_rows"],
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
    import importlib.util

    from ilargi_sklearn import planner

    if importlib.util.find_spec("catboost") is None:
        # Checked before the timings: training comes at their end.
        raise UsageError(
            "calibrate trains the planner's CatBoost model, and CatBoost is not "
            "installed: pip install 'ilargi-sklearn[planner]' (or pip install "
            "catboost)."
        )

    console.info(
        f"calibrating the planner on this machine (budget {args.budget:g} s)"
        + (f", Hamlet datasets from {args.hamlet}" if args.hamlet else "")
    )
    t0 = time.perf_counter()
    result = planner.calibrate(
        args.records,
        budget_seconds=args.budget,
        hamlet_path=args.hamlet,
        progress=not console.quiet,
        model_path=args.model,
    )
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
        emit_json(console, doc)
    return EXIT_OK
