"""The baseline policies that the learned cost model is compared with (DESIGN.md 5).

Each is a pure function of the plan features (:func:`plan_features`, or any dict
with the keys it reads) that returns a representation, ``"factorized"`` or
``"materialized"``.
"""

from __future__ import annotations

from typing import Any

from ilargi_sklearn.planner._features import plan_costs

__all__ = [
    "BASELINES",
    "always_factorize",
    "always_materialize",
    "amalur_rule",
    "flop_ratio",
    "morpheus_rule",
]


def always_materialize(features: dict[str, Any]) -> str:
    """Always build the join first (what users do today)."""
    return "materialized"


def always_factorize(features: dict[str, Any]) -> str:
    """Always train on the sources."""
    return "factorized"


def morpheus_rule(
    features: dict[str, Any], *, tuple_ratio: float = 5.0, feature_ratio: float = 1.0
) -> str:
    """Morpheus' rule: factorize iff the tuple ratio > 5 and the feature ratio > 1.

    Parameters
    ----------
    features : dict
        Reads ``tuple_ratio`` (target rows over the rows of all dimension tables
        together) and ``feature_ratio`` (dimension columns over base columns; for a
        many-to-many schema, without base columns, the dimension columns).
    tuple_ratio, feature_ratio : float
        The thresholds (Chen et al., PVLDB 2017).

    Returns
    -------
    representation : {"factorized", "materialized"}

    Examples
    --------
    >>> morpheus_rule({"tuple_ratio": 10.0, "feature_ratio": 2.0})
    'factorized'
    >>> morpheus_rule({"tuple_ratio": 3.0, "feature_ratio": 2.0})
    'materialized'
    """
    tr = float(features["tuple_ratio"])
    fr = float(features["feature_ratio"])
    return "factorized" if tr > tuple_ratio and fr > feature_ratio else "materialized"


def flop_ratio(features: dict[str, Any]) -> float:
    """Estimated FLOPs of the materialized plan over those of the factorized plan.

    Reads ``flops_materialized`` and ``flops_factorized`` when given, else computes
    them with :func:`plan_costs` (CPU plans, dense and sparse multiply-adds, one
    addition per gathered or scattered element of the factorized plan; building the
    join not counted: the rule compares the linear algebra of training).
    """
    if "flops_materialized" in features and "flops_factorized" in features:
        fm = float(features["flops_materialized"])
        ff = float(features["flops_factorized"])
    else:
        fm = plan_costs(features, "materialized-cpu", cached=True)["flops"]
        fact = plan_costs(features, "factorized-cpu")
        ff = fact["flops"] + fact["gather_bytes"] / 24.0
    return fm / max(ff, 1.0)


def amalur_rule(features: dict[str, Any], *, threshold: float = 1.5) -> str:
    """Amalur's rule: factorize iff the estimated FLOP ratio (materialized over
    factorized) is above ``threshold``.

    Parameters
    ----------
    features : dict
        ``flops_materialized`` and ``flops_factorized``, or the raw plan features
        (see :func:`flop_ratio`).
    threshold : float, default=1.5

    Returns
    -------
    representation : {"factorized", "materialized"}

    Examples
    --------
    >>> amalur_rule({"flops_materialized": 4e9, "flops_factorized": 1e9})
    'factorized'
    >>> amalur_rule({"flops_materialized": 1.2e9, "flops_factorized": 1e9})
    'materialized'
    """
    return "factorized" if flop_ratio(features) > threshold else "materialized"


#: Baseline policies by name.
BASELINES = {
    "always_materialize": always_materialize,
    "always_factorize": always_factorize,
    "morpheus": morpheus_rule,
    "amalur": amalur_rule,
}
