"""A new process loads only the compiled kernels its fits use, and can start numba
while it reads its data (``_launcher.preload``); neither changes a result."""

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
    coef = FactorizedLogisticRegression(max_iter=30).fit(d.dataset, y).coef_
    {after}
    print(json.dumps({{
        "coef": coef.ravel().tolist(),
        "kernels": sorted(_launcher._state["kernels"]),
        "numba": _launcher._state["numba"] is not False,
    }}))
"""


@pytest.fixture(scope="module")
def plain():
    return _fresh(_FIT.format(before="", after=""))


def test_a_fit_loads_only_the_kernels_it_uses(plain):
    """Logistic regression makes the dispatchers of its two kernels, none of
    K-Means', GNMF's or the gram's (numba loads a dispatcher's machine code
    from its cache at its first call)."""
    assert plain["numba"]
    assert plain["kernels"] == ["binomial_derivative", "binomial_predictor"]


@pytest.mark.slow
def test_preload_starts_numba_and_changes_no_result(plain):
    """preload() runs numba's import and compiler start on a thread; a fit that
    starts while it runs (racing it for numba's lock) gives the same model."""
    raced = _fresh(
        _FIT.format(
            before="thread = _launcher.preload()",
            after="thread.join(); assert _launcher.preload() is None",
        )
    )
    assert raced["coef"] == plain["coef"]
    assert raced["kernels"] == plain["kernels"]


def test_preload_does_nothing_when_the_kernels_are_off(monkeypatch):
    monkeypatch.setenv(_launcher.NO_NUMBA_ENV, "1")
    assert _launcher.preload() is None


def test_the_cli_starts_numba_while_it_reads(monkeypatch, tmp_path, capsys):
    from test_cli import SPEC, write_star

    from ilargi_sklearn.cli import main

    calls = []
    monkeypatch.setattr(_launcher, "preload", lambda: calls.append(1))
    write_star(tmp_path / "data")
    (tmp_path / "star.toml").write_text(SPEC)
    assert main(["fit", str(tmp_path / "star.toml"), "--cv", "0", "--no-save"]) == 0
    assert calls == [1]
