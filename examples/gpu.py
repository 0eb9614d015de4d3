"""GPU: fit on a GPU, compare with the CPU fit, and see the planner's GPU plans.

Run with ``python examples/gpu.py`` (a few seconds; needs ``pip install
"ilargi-sklearn[gpu]"`` and an NVIDIA GPU).

The probe (:func:`ilargi_sklearn._backend._gpu.probe_gpu`) runs tiny cuBLAS,
cuSPARSE and scatter-add operations once per process and returns ``(usable,
reason)``; it never raises and never imports CuPy unless it is installed. Without a
usable GPU this example prints the probe's reason and exits.
"""

import os
import sys
import time

import numpy as np

from ilargi_sklearn._backend._gpu import probe_gpu


def main() -> int:
    usable, reason = probe_gpu()
    if not usable:
        print(f"skipped: no usable GPU ({reason}).")
        return 0
    print(f"GPU usable: {reason}")

    from ilargi_sklearn import AutoPlan, FactorizedLinearRegression
    from ilargi_sklearn._backend._namespace import to_numpy
    from ilargi_sklearn.datasets import make_multi_source

    n_rows = 20_000 if os.environ.get("ILARGI_EXAMPLE_SMALL") else 1_000_000
    data = make_multi_source(n_rows, tuple_ratio=20, feature_ratio=5, random_state=0)
    ds_gpu = data.dataset.to_device("gpu")  # moved once, cached on the dataset

    t0 = time.perf_counter()
    cpu = FactorizedLinearRegression(device="cpu").fit(data.dataset, data.target)
    t_cpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    gpu = FactorizedLinearRegression(device="gpu").fit(ds_gpu, data.target)
    coef = to_numpy(gpu.coef_)  # fitted attributes stay on the GPU
    t_gpu = time.perf_counter() - t0
    print(f"CPU fit {t_cpu:.3f} s, GPU fit {t_gpu:.3f} s (first GPU call included)")
    print(f"max |coef_gpu - coef_cpu| = {np.max(np.abs(coef - cpu.coef_)):.2e}")

    auto = AutoPlan(FactorizedLinearRegression(), devices="auto")
    auto.fit(data.dataset, data.target)
    print(f"planner candidates: {sorted(auto.predicted_seconds_)}; chose {auto.plan_}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
