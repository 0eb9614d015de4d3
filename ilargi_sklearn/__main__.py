"""``python -m ilargi_sklearn``: the ``ilargi`` command line (see :mod:`ilargi_sklearn.cli`)."""

import sys

from ilargi_sklearn.cli import main

if __name__ == "__main__":
    sys.exit(main())
