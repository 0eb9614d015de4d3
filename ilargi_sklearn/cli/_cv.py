"""Cross-validation one fold at a time, and what the planner chose in each fit.

Shared by ``ilargi fit`` and ``ilargi demo``: folds run with a progress bar, their
warnings are collected instead of printed once per fold, and the fitted
:class:`~ilargi_sklearn.planner.AutoPlan` of every fold reports its predicted and
chosen plans as JSON-able values.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ilargi_sklearn._backend._plan import Plan
from ilargi_sklearn.cli._console import Progress, plain


def strategy_of(plan: str) -> str | None:
    """The strategy of a plan name (``"factorized-cpu"``, or a bare strategy),
    None for ``"auto"``."""
    try:
        return Plan.parse(str(plan)).strategy
    except ValueError:
        return None


def plan_info(fitted: Any) -> dict[str, Any] | None:
    """What a fitted planner predicted and chose, as plain JSON-able values.

    Looks for the planner inside a fitted :class:`~sklearn.pipeline.Pipeline` (its
    last step) too. Returns None when ``fitted`` holds no fitted planner.
    """
    if hasattr(fitted, "steps"):
        fitted = fitted.steps[-1][1]
    if not hasattr(fitted, "plan_"):
        return None
    predicted = getattr(fitted, "predicted_seconds_", None) or {}
    measured = getattr(fitted, "fit_seconds_", None)
    return {
        "plan": plain(fitted.plan_),
        "strategy": strategy_of(fitted.plan_),
        "predicted_seconds": {str(plain(k)): float(v) for k, v in predicted.items()},
        "fit_seconds": None if measured is None else float(measured),
        "fallback_reason": plain(getattr(fitted, "fallback_reason_", None)),
    }


def summarize_plans(infos: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Mean predicted seconds per plan and the choices, over cross-validation folds."""
    infos = [i for i in infos if i]
    if not infos:
        return None
    keys = list(dict.fromkeys(k for i in infos for k in i["predicted_seconds"]))
    predicted = {
        k: float(
            np.mean(
                [
                    i["predicted_seconds"][k]
                    for i in infos
                    if k in i["predicted_seconds"]
                ]
            )
        )
        for k in keys
    }
    chosen: dict[str, int] = {}
    for i in infos:
        chosen[str(i["plan"])] = chosen.get(str(i["plan"]), 0) + 1
    measured = [i["fit_seconds"] for i in infos if i.get("fit_seconds") is not None]
    return {
        "predicted_seconds": predicted,
        "chosen": chosen,
        "n_fits": len(infos),
        "measured_seconds": float(np.mean(measured)) if measured else None,
        "fallback_reasons": sorted(
            {str(i["fallback_reason"]) for i in infos if i.get("fallback_reason")}
        ),
    }


def describe_plans(summary: dict[str, Any] | None) -> str:
    """One line of :func:`summarize_plans`: predicted times, choices, fallbacks."""
    if summary is None:
        return "planner: no plan information"
    pred = ", ".join(f"{k} {v:.3g} s" for k, v in summary["predicted_seconds"].items())
    chosen = ", ".join(
        f"{plan} ({n}/{summary['n_fits']} fits)"
        for plan, n in summary["chosen"].items()
    )
    line = f"predicted {pred or '-'} -> chose {chosen}"
    if summary.get("measured_seconds") is not None:
        line += f"; measured {summary['measured_seconds']:.3g} s per fit"
    if summary.get("fallback_reasons"):
        line += f"; fallbacks: {', '.join(summary['fallback_reasons'])}"
    return line


@dataclass
class CVResult:
    """Scores and timings of a cross-validation run."""

    scores: list[float]
    fit_seconds: list[float]
    score_seconds: list[float]
    scoring: str
    estimators: list[Any] = field(default_factory=list, repr=False)
    n_warnings: int = 0
    warning_messages: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "scoring": self.scoring,
            "scores": [float(s) for s in self.scores],
            "mean": float(np.mean(self.scores)) if self.scores else None,
            "std": float(np.std(self.scores)) if self.scores else None,
            "fit_seconds": [float(s) for s in self.fit_seconds],
            "score_seconds": [float(s) for s in self.score_seconds],
            "n_warnings": self.n_warnings,
            "warnings": self.warning_messages,
        }


def cross_validate_progress(
    estimator: Any,
    X: Any,
    y: Any,
    *,
    cv: Any,
    scoring: str | None = None,
    progress: Progress | None = None,
    groups: Any = None,
) -> CVResult:
    """``sklearn.model_selection.cross_validate``, one fold at a time with progress.

    Parameters
    ----------
    estimator : estimator
        Cloned for every fold.
    X : {array-like, MultiSourceDataset}
        Row-sliced per fold (a dataset slices its index vectors only).
    y : array-like or None
    cv : cross-validation splitter
        With ``split(X, y)``; called on a placeholder of the right length.
    scoring : str, optional
        A scikit-learn scorer name; default the estimator's ``score``.
    progress : Progress, optional
        Advanced once per fold; it shows the mean score of the folds so far (the
        summary's figure), not the last fold's.
    groups : array-like, optional
        Group labels for a group splitter (``GroupKFold``).

    Returns
    -------
    CVResult
        Warnings raised by the fits (a ConvergenceWarning, say) are counted and
        their distinct messages kept, instead of being printed once per fold.
    """
    from sklearn.base import clone
    from sklearn.metrics import check_scoring

    n = X.shape[0]
    placeholder = np.zeros((n, 1))
    scorer = check_scoring(estimator, scoring=scoring)
    result = CVResult([], [], [], scoring or "score")
    for train, test in cv.split(placeholder, y, groups):
        est = clone(estimator)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            if y is None:
                est.fit(X[train])
            else:
                est.fit(X[train], y[train])
            t1 = time.perf_counter()
            if y is None:
                score = scorer(est, X[test])
            else:
                score = scorer(est, X[test], y[test])
            t2 = time.perf_counter()
        for w in caught:
            if issubclass(w.category, (FutureWarning, DeprecationWarning)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            result.n_warnings += 1
            msg = f"{w.category.__name__}: {w.message}"
            if msg not in result.warning_messages:
                result.warning_messages.append(msg)
        result.scores.append(float(score))
        result.fit_seconds.append(t1 - t0)
        result.score_seconds.append(t2 - t1)
        result.estimators.append(est)
        if progress is not None:
            progress.advance(note=f"mean score {np.mean(result.scores):.4f}")
    return result
