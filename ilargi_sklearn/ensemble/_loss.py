"""The boosting losses: scikit-learn's own loss objects.

The gradients and hessians of every boosting iteration are n-length arrays over the
target rows, computed once per iteration whatever the schema: nothing in them
factorizes. Using scikit-learn's loss objects (``sklearn._loss.loss``, private)
gives bitwise its float32 gradients and hessians, its baseline
(``fit_intercept_only``) and its link functions, which is what makes the trees
identical. The import is guarded: a scikit-learn that moves them raises an
``ImportError`` that says which version this package was checked against.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_loss"]

#: The scikit-learn release whose private loss module this was checked against.
CHECKED_WITH = "1.9"


def _losses() -> Any:
    try:
        from sklearn._loss import loss
    except ImportError as exc:  # pragma: no cover - depends on scikit-learn
        raise ImportError(
            "ilargi_sklearn's gradient boosting uses scikit-learn's loss objects "
            f"(sklearn._loss.loss, checked with scikit-learn {CHECKED_WITH}); this "
            f"scikit-learn does not have them ({exc}). Install scikit-learn "
            f"{CHECKED_WITH}."
        ) from exc
    return loss


def make_loss(
    name: str, sample_weight: Any, *, quantile: float | None = None, n_classes: int = 1
) -> Any:
    """The loss object of ``HistGradientBoosting*``'s ``loss=name``.

    ``name`` is one of ``"squared_error"``, ``"absolute_error"``, ``"poisson"``,
    ``"gamma"``, ``"quantile"`` (with ``quantile``) and ``"log_loss"`` (binomial
    for ``n_classes <= 2``, else multinomial). Hessians are constant only without
    sample weights (the losses decide).
    """
    L = _losses()
    if name == "log_loss":
        if n_classes <= 2:
            return L.HalfBinomialLoss(sample_weight=sample_weight)
        return L.HalfMultinomialLoss(sample_weight=sample_weight, n_classes=n_classes)
    if name == "quantile":
        return L.PinballLoss(sample_weight=sample_weight, quantile=quantile)
    classes = {
        "squared_error": L.HalfSquaredError,
        "absolute_error": L.AbsoluteError,
        "poisson": L.HalfPoissonLoss,
        "gamma": L.HalfGammaLoss,
    }
    return classes[name](sample_weight=sample_weight)
