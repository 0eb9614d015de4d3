"""A new process loads only the compiled kernels its fits use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from ilargi_sklearn._backend import _launcher

pytest.importorskip("numba")


def _fresh(code: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tempfile.gettempdir(),
        env={
            **{k: v for k, v in os.environ.items() if k != _launcher.NO_NUMBA_ENV},
            **env,
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_FIT = """
    import json, sys
    import numpy as np
    from ilargi_sklearn._backend import _launcher
    {before}
    from ilargi_sklearn import FactorizedLogisticRegression
    from ilargi_sklearn.datasets import make_multi_source
    d = make_multi_source(n_rows=3000, random_state=0)
    y = (d.target > np.median(d.target)).astype(int)
    # Making the data multiplies the dataset (the products' kernels): not the fit's.
    made = set(_launcher._state["kernels"])
    coef = FactorizedLogisticRegression(max_iter=30).fit(d.dataset, y).coef_
    print(json.dumps({{
        "coef": coef.ravel().tolist(),
        "kernels": sorted(set(_launcher._state["kernels"]) - made),
        "numba": _launcher._state["numba"] is not False,
    }}))
"""


def test_a_fit_loads_only_the_kernels_it_uses():
    """Logistic regression makes the dispatchers of its two kernels, none of
    K-Means', GNMF's or the gram's (numba loads a dispatcher's machine code
    from its cache at its first call)."""
    got = _fresh(_FIT.format(before=""))
    assert got["numba"]
    assert got["kernels"] == ["binomial_derivative", "binomial_predictor"]


def test_ilargi_fit_loads_only_the_kernels_its_fit_uses(tmp_path):
    """The command line made a dispatcher of every kernel, and read its cache
    index, before each fit (to say whether some would compile)."""
    from _cli_data import SPEC, write_star

    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC.replace("FactorizedLinearRegression", "kmeans"))
    code = f"""
        import json
        from ilargi_sklearn._backend import _launcher
        from ilargi_sklearn.cli import main
        assert main(["fit", {str(spec)!r}, "--cv", "0", "--no-save", "-q"]) == 0
        print(json.dumps({{"kernels": sorted(_launcher._state["kernels"])}}))
    """
    got = _fresh(code)["kernels"]
    # K-Means' own kernels, and the operator's compiled products that its
    # seeding calls (T @ C^T with a few columns): no other family's kernel.
    own = {"assign", "partial_at", "accumulate"}
    assert got and own & set(got), got
    assert all(k in own or k.startswith("products_") for k in got), got
