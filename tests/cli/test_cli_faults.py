"""The command line never fails from deep inside: damaged model files, exit codes,
hints a spec user can follow, ``--quiet``, and the estimators it accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import joblib
import pandas as pd
import pytest
from _cli_data import SPEC, run, variant, write_star

from ilargi_sklearn.cli._checks import ESTIMATORS, estimator_names

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


@pytest.fixture
def star(tmp_path):
    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC)
    return spec


@pytest.fixture
def fitted(star, tmp_path, capsys):
    """A model saved by ``ilargi fit`` (and its report)."""
    code, _, err = run(["fit", star, "--out", tmp_path / "out", "--cv", "0"], capsys)
    assert code == 0, err
    return tmp_path / "out" / "star.joblib"


# ------------------------------------------------------------ damaged models
@pytest.mark.parametrize(
    "damage", ["truncate", "flip-header", "flip-data", "empty", "zeros"]
)
def test_predict_on_a_damaged_model_says_so_in_one_line(fitted, capsys, damage):
    data = fitted.read_bytes()
    damaged = {
        "truncate": data[: len(data) // 2],
        "flip-header": data[:40] + bytes([data[40] ^ 0xFF]) + data[41:],
        # A byte of the coefficients: it unpickles, as another model.
        "flip-data": data[:-30] + bytes([data[-30] ^ 0x01]) + data[-29:],
        "empty": b"",
        "zeros": bytes(len(data)),
    }[damage]
    fitted.write_bytes(damaged)
    code, out, err = run(["predict", fitted, "--out", fitted.parent / "p.csv"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ilargi: error: ")
    assert "not a readable model file: truncated or damaged? re-run ilargi fit" in err
    assert "Traceback" not in err and not (fitted.parent / "p.csv").exists()


def test_damaged_model_without_its_report_still_one_line(fitted, star, capsys):
    fitted.with_name("star.report.json").unlink()
    fitted.write_bytes(fitted.read_bytes()[:100])
    code, _, err = run(["predict", fitted, "--spec", star], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "not a readable model file" in err


def test_fit_records_the_model_checksum(fitted):
    import hashlib

    report = json.loads(fitted.with_name("star.report.json").read_text())
    assert report["model_sha256"] == hashlib.sha256(fitted.read_bytes()).hexdigest()


# ------------------------------------------------------------ exit codes
def test_every_usage_error_exits_2(fitted, star, tmp_path, capsys):
    """docs/cli.rst: 2 when the command cannot start, 1 when running fails."""
    usage = [
        ["predict", tmp_path / "none.joblib"],
        ["predict", fitted, "--table", "sales"],
        ["predict", fitted, "--keep", "no_such_column"],
        ["predict", fitted, "--table", "nosuch=x.csv"],
        ["predict", fitted, "--handle-unknown", "maybe"],
        ["fit", tmp_path / "none.toml"],
        ["fit", star, "--cv", "1"],
        ["fit", star, "--plan", "fast"],
        ["calibrate", "--budget", "-5"],
        ["calibrate", "--budget", "nan"],
        ["bench", "--script-args=--x 'unbalanced"],
        ["demo", "--n-rows", "0"],
        ["nosuchcommand"],
        [],
    ]
    for argv in usage:
        code, out, err = run(argv, capsys)
        assert code == 2, (argv, err)
        assert err.strip() or argv == [], argv  # no command: the help, on stdout
        assert "Traceback" not in err
    code, _, err = run(["predict", fitted, "--keep", "no_such_column"], capsys)
    assert "--keep: column 'no_such_column' not found" in err


def test_bad_script_args_exit_2_before_running(tmp_path, capsys):
    bdir = tmp_path / "benchmarks"
    bdir.mkdir()
    (bdir / "bench_operators.py").write_text("raise SystemExit(5)\n")
    code, _, err = run(
        ["bench", "--benchmarks-dir", bdir, "--script-args=--x 'unbalanced"], capsys
    )
    assert code == 2 and "--script-args" in err and "closing quotation" in err


def test_calibrate_without_catboost_exits_2_before_timing(monkeypatch, capsys):
    import importlib.util

    from ilargi_sklearn import planner

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "catboost" else real(name, *a),
    )
    monkeypatch.setattr(planner, "calibrate", lambda *a, **k: pytest.fail("timed"))
    code, _, err = run(["calibrate", "--budget", "5"], capsys)
    assert code == 2 and "pip install 'ilargi-sklearn[planner]'" in err


def test_unknown_categories_use_the_flag_spelling(fitted, star, tmp_path, capsys):
    d = star.parent / "data"
    products = pd.read_csv(d / "products.csv")
    products.loc[0, "category"] = "zzz"
    products.to_csv(tmp_path / "products_new.csv", index=False)
    argv = [
        "predict",
        fitted,
        "--table",
        f"products={tmp_path / 'products_new.csv'}",
        "--out",
        tmp_path / "p.csv",
    ]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    assert "--handle-unknown ignore to silence this" in err
    assert "--handle-unknown error" in err and "handle_unknown" not in err
    code, _, err = run([*argv, "--handle-unknown", "error"], capsys)
    assert code == 1
    assert "--handle-unknown warn or --handle-unknown ignore" in err
    assert "handle_unknown" not in err


# ------------------------------------------------------------ hints
def _text_target(star: Path) -> Path:
    d = star.parent / "data"
    sales = pd.read_csv(d / "sales.csv")
    sales["grade"] = ["low", "high"] * (len(sales) // 2)
    sales["y_text"] = sales["y"].map(lambda v: f"{v:.3f}")
    sales.to_csv(d / "sales.csv", index=False)
    return star


@pytest.mark.parametrize("name", ["FactorizedLinearRegression", "ridge", "lasso_cv"])
def test_regressor_on_a_text_target_fails_before_building(
    star, monkeypatch, capsys, name
):
    import ilargi_sklearn.multisource as multisource

    spec = variant(_text_target(star), 'column = "y"', 'column = "grade"', "text.toml")
    spec = variant(spec, 'name = "FactorizedLinearRegression"', f'name = "{name}"')
    monkeypatch.setattr(
        multisource, "from_frames", lambda *a, **k: pytest.fail("data was built")
    )
    code, _, err = run(["fit", spec, "--no-save"], capsys)
    assert code == 2, err
    assert "target.column" in err and "target column 'grade'" in err
    assert "holds text" in err and "e.g. 'low'" in err
    assert '"FactorizedLogisticRegression"' in err and "threshold" in err


def test_numbers_stored_as_text_suggest_a_cast(star, capsys):
    d = star.parent / "data"
    sales = pd.read_csv(d / "sales.csv")
    sales["y_text"] = sales["y"].map(lambda v: f"{v:.3f}")
    sales.loc[5, "y_text"] = "?"  # one value that is not a number: a text column
    sales.to_csv(d / "sales.csv", index=False)
    spec = variant(star, 'column = "y"', 'column = "y_text"', "text.toml")
    code, _, err = run(["fit", spec, "--no-save"], capsys)
    assert code == 2 and "target column 'y_text'" in err
    assert "values such as ['?'] are not" in err
    assert 'cast = { y_text = "float" } in [tables.sales]' in err


def test_threshold_on_a_text_target_fails_before_building(star, monkeypatch, capsys):
    import ilargi_sklearn.multisource as multisource

    monkeypatch.setattr(
        multisource, "from_frames", lambda *a, **k: pytest.fail("data was built")
    )
    spec = variant(
        _text_target(star),
        'column = "y"',
        'column = "grade"\nthreshold = 1',
        "text.toml",
    )
    spec = variant(
        spec, 'name = "FactorizedLinearRegression"', 'name = "logistic_regression"'
    )
    code, _, err = run(["fit", spec, "--no-save"], capsys)
    assert code == 2 and "target.threshold" in err
    assert "threshold needs a numeric target" in err and "'grade'" in err


# ------------------------------------------------------------ --quiet
def test_quiet_prints_results_and_errors_only(star, capsys):
    code, out, err = run(["fit", star, "--no-save", "--cv", "2", "-q"], capsys)
    assert code == 0, err
    assert err == ""
    lines = out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "plan",
        "cross-validated r2",
        "final fit on 399 rows",
    ], out
    # Without -q: the description and the join lines too.
    code, loud, _ = run(["fit", star, "--no-save", "--cv", "2"], capsys)
    assert "join customers (left): matched" in loud and "joined:" in loud


def test_quiet_still_shows_warnings(star, capsys):
    spec = variant(star, 'name = "FactorizedLinearRegression"', 'name = "kmeans"')
    code, out, err = run(["fit", spec, "--no-save", "--cv", "0", "-q"], capsys)
    assert code == 0, err
    assert "unsupervised: the target is ignored" in err


# ------------------------------------------------------------ estimators
def test_the_cli_accepts_every_estimator_of_the_package():
    import inspect

    import ilargi_sklearn

    models = {
        n
        for n in ilargi_sklearn.__all__
        if n.startswith("Factorized")
        and inspect.isclass(getattr(ilargi_sklearn, n))
        and not getattr(ilargi_sklearn, n).__module__.endswith(
            ("_scaler", "_polynomial")
        )
    }
    assert set(estimator_names()) == models
    for required in ("FactorizedRidgeCV", "FactorizedPCA", "FactorizedLassoCV"):
        assert required in estimator_names()


def test_docs_list_every_estimator_the_cli_accepts():
    text = (DOCS / "cli.rst").read_text()
    section = text[text.index("``[estimator]``") : text.index("``[cv]``")]
    listed = set(re.findall(r"``(Factorized\w+)``", section))
    assert listed == set(estimator_names()), listed ^ set(estimator_names())


@pytest.mark.parametrize("key", sorted(ESTIMATORS))
def test_every_cli_estimator_fits_from_a_spec(star, capsys, key):
    from ilargi_sklearn.cli import load_spec

    name = ESTIMATORS[key][1]
    spec = variant(star, 'name = "FactorizedLinearRegression"', f'name = "{name}"')
    task = load_spec(spec).task
    if task == "classification":
        spec = variant(spec, 'column = "y"', 'column = "y"\nthreshold = 20', "c.toml")
        spec = variant(spec, 'scoring = "r2"', 'scoring = "accuracy"', "c.toml")
    elif task == "unsupervised":
        spec = variant(spec, 'scoring = "r2"\n', "", "u.toml")
    code, out, err = run(["fit", spec, "--no-save", "--cv", "0", "-q"], capsys)
    assert code == 0, err
    assert "final fit on" in out


def test_old_pickles_still_unpickle(fitted):
    assert hasattr(joblib.load(fitted), "predict")
