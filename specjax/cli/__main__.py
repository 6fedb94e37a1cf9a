"""``python -m specjax.cli``: the ``specjax`` command."""

import sys

from specjax.cli import main

if __name__ == "__main__":
    sys.exit(main())
