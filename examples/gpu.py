"""GPU: probe for a usable GPU and see which plans the planner may use.

Run with ``python examples/gpu.py`` (a few seconds).

The probe (:func:`ilargi_sklearn._backend._gpu.probe_gpu`) runs tiny cuBLAS,
cuSPARSE and scatter-add operations once per process and returns ``(usable,
reason)``; it never raises and never imports CuPy unless it is installed. Today the
estimators compute on the CPU (NumPy/SciPy): GPU kernels (CuPy) are planned, and
until an estimator has a ``device`` parameter the planner considers CPU plans only.
Without a usable GPU this example prints the probe's reason and exits.
"""

import sys

from ilargi_sklearn._backend._gpu import probe_gpu


def main() -> int:
    usable, reason = probe_gpu()
    if not usable:
        print(f"skipped: no usable GPU ({reason}).")
        return 0
    print(f"GPU usable: {reason}")

    from ilargi_sklearn import FactorizedLinearRegression
    from ilargi_sklearn.datasets import make_multi_source

    try:
        from ilargi_sklearn.planner import AutoPlan
    except ImportError as exc:
        print(f"the planner is not installed ({exc}); nothing more to show.")
        return 0
    data = make_multi_source(50_000, tuple_ratio=20, random_state=0)
    est = FactorizedLinearRegression()
    has_device = "device" in est.get_params()
    auto = AutoPlan(est, devices="auto").fit(data.dataset, data.target)
    print(f"candidate plans: {sorted(auto.predicted_seconds_)}")
    print(f"chosen: {auto.plan_}")
    if not has_device:
        print(
            "FactorizedLinearRegression has no GPU implementation yet, so only CPU "
            "plans are candidates."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
