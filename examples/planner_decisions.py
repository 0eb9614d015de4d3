"""The planner: predicted times, chosen plans and the rules it is compared with.

Run with ``python examples/planner_decisions.py`` (about 20 s on 2 cores). Set
``ILARGI_EXAMPLE_SMALL=1`` for a quick run.

:class:`~ilargi_sklearn.planner.AutoPlan` wraps an estimator: at ``fit`` it computes
features of the data (rows, tuple and feature ratios, sparsity), of the estimator
(iterations, classes) and of the hardware, predicts the time of every plan (train
on the sources, "factorized", or on the joined matrix, "materialized"), fits the
fastest and records what it predicted. Factorization pays on redundant data (high
tuple ratio, wide dimension tables) and loses where there is little redundancy:
the schemas below cover both. If ``ilargi_sklearn.planner`` is not installed the
example says so and exits.
"""

import os
import sys

from sklearn.pipeline import make_pipeline

from ilargi_sklearn import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
    FactorizedStandardScaler,
)
from ilargi_sklearn.datasets import load_flights, make_multi_source

SMALL = os.environ.get("ILARGI_EXAMPLE_SMALL") == "1"


def main() -> int:
    try:
        from ilargi_sklearn.planner import AutoPlan, amalur_rule, morpheus_rule
    except ImportError as exc:
        print(f"skipped: the planner is not installed ({exc}).")
        return 0

    n = 5_000 if SMALL else 100_000
    cases = [
        (
            "synthetic, little redundancy (TR 1, FR 0.5)",
            make_multi_source(n, tuple_ratio=1, feature_ratio=0.5, random_state=0),
        ),
        (
            "synthetic, redundant (TR 50, FR 5)",
            make_multi_source(n, tuple_ratio=50, feature_ratio=5, random_state=0),
        ),
    ]
    flights = load_flights(n_rows=n)
    cases.append((f"nycflights13, {n:,} flights", flights))

    print(
        f"{'dataset':<46} {'estimator':<28} {'predicted s (fact / mat)':>25}  "
        f"{'chosen':<16} {'measured s':>10}  morpheus / amalur"
    )
    for label, data in cases:
        for est, y in (
            (AutoPlan(FactorizedLinearRegression()), data.target),
            # Scaled first, so that L-BFGS converges; AutoPlan plans the last step.
            (
                make_pipeline(
                    FactorizedStandardScaler(), AutoPlan(FactorizedLogisticRegression())
                ),
                data.target > data.target.mean(),
            ),
        ):
            est.fit(data.dataset, y)
            auto = est[-1] if hasattr(est, "steps") else est
            pred = auto.predicted_seconds_
            fact = pred.get("factorized-cpu", float("nan"))
            mat = pred.get("materialized-cpu", float("nan"))
            rules = f"{morpheus_rule(auto.features_)} / {amalur_rule(auto.features_)}"
            print(
                f"{label:<46} {type(auto.estimator).__name__:<28} "
                f"{fact:>11.4f} / {mat:<11.4f}  {auto.plan_:<16} "
                f"{auto.fit_seconds_:>10.4f}  {rules}"
            )
    print(
        "\nThe predictions come from the cost model trained by `ilargi calibrate` on "
        "this machine\nwhen there is one, else from the model shipped with the "
        "package, else from a roofline model."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
