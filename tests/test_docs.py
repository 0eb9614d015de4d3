"""The documentation builds without warnings and covers the public API."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Modules whose ``__all__`` is public API (the planner's page is generated from
#: its ``__all__`` by docs/conf.py, so it is complete by construction).
PUBLIC = {
    "ilargi_sklearn": None,
    "ilargi_sklearn.datasets": set(),
    "ilargi_sklearn.multisource": set(),
    "ilargi_sklearn.cli": set(),
}


def test_every_public_name_is_in_the_api_reference():
    api = (DOCS / "api.rst").read_text()
    listed = set(re.findall(r"^   (\w+)$", api, flags=re.MULTILINE))
    for module, exempt in PUBLIC.items():
        names = set(importlib.import_module(module).__all__) - {"__version__"}
        missing = names - listed - (exempt or set())
        assert not missing, f"{module}: {sorted(missing)} not in docs/api.rst"


def test_files_named_in_the_docs_exist():
    text = "\n".join(p.read_text() for p in DOCS.rglob("*.rst"))
    text += (ROOT / "README.md").read_text()
    named = set(re.findall(r"examples/[\w./]+\.(?:py|toml)", text))
    named |= set(re.findall(r"benchmarks/[\w./]+\.(?:py|md)", text))
    assert named
    missing = [n for n in sorted(named) if not (ROOT / n).is_file()]
    assert not missing, missing


def test_readme_first_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0] == "python -m pip install . && ilargi demo"
    assert block[1] == 'python -m pip install ".[test]" && python -m pytest'


@pytest.mark.skipif(
    any(
        importlib.util.find_spec(m) is None
        for m in ("sphinx", "numpydoc", "matplotlib")
    ),
    reason="building the docs needs sphinx, numpydoc and matplotlib "
    "(pip install sphinx numpydoc matplotlib)",
)
def test_docs_build_without_warnings(tmp_path):
    # Build from a copy: autosummary writes its stubs into the source folder.
    src = tmp_path / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "generated"))
    # literalinclude of ../examples/*.toml: the examples sit next to the copy.
    shutil.copytree(
        ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("data")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(src),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    html = tmp_path / "html"
    for page in ("index", "getting_started", "cli", "calibration", "benchmarks", "api"):
        assert (html / f"{page}.html").is_file()
    assert len(list((html / "_images").glob("benchmarks-*.png"))) == 3
    assert (html / "generated" / "ilargi_sklearn.FactorizedKMeans.html").is_file()


def _code_blocks(page: Path) -> list[tuple[str, dict[str, str], str]]:
    """``(language, options, code)`` of every ``.. code-block::`` of a page."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = re.match(r"^\.\. code-block:: (\w+)\s*$", lines[i])
        i += 1
        if not m:
            continue
        options = {}
        while i < len(lines) and re.match(r"^\s+:(\w+):\s*(.*)$", lines[i]):
            k, v = re.match(r"^\s+:(\w+):\s*(.*)$", lines[i]).groups()
            options[k] = v
            i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
            body.append(lines[i][4:])
            i += 1
        blocks.append((m.group(1), options, "\n".join(body).strip() + "\n"))
    return blocks


def test_training_to_scoring_page_runs(tmp_path, monkeypatch):
    """Every code block of the "From training to scoring" page runs, in order: Python
    in one namespace, TOML written to its caption's file, shell lines as commands."""
    blocks = _code_blocks(DOCS / "guide" / "workflow.rst")
    assert {lang for lang, _, _ in blocks} >= {"python", "toml", "bash", "text"}
    monkeypatch.chdir(tmp_path)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    namespace: dict = {"__name__": "workflow_page"}
    for lang, options, code in blocks:
        if lang == "python":
            exec(compile(code, "workflow.rst", "exec"), namespace)
        elif lang == "toml":
            (tmp_path / options["caption"]).write_text(code)
        elif lang == "bash":
            for line in code.splitlines():
                proc = subprocess.run(
                    line,
                    shell=True,
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=300,
                )
                assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
    scored = namespace["scored"]
    assert len(scored) == len(namespace["new_ds"]) > 0
    predictions = (tmp_path / "predictions.csv").read_text().splitlines()
    assert predictions[0].startswith("base_row,") and len(predictions) > 1
