"""The ``specjax`` command: generate with the bundled pair, train, distil.

User errors (bad options, missing files, mismatched models, an --out that would
be overwritten) print one line to stderr and exit with status 2, and the train
and distill commands check everything they can before training starts. A
failing file system (a full disk, a permission denied) prints one line and exits
with status 1. Only genuine bugs show a traceback.

One module per concern, each importing only those above it (JAX and the models are
imported inside the commands, as they always were):

* `~specjax.cli.common`: `UserError`, flag checks and loading a model;
* `~specjax.cli.generate`: ``specjax generate``;
* `~specjax.cli.train`: ``specjax train``, ``distill`` and ``train-drafter``;
* `~specjax.cli.parser`: `build_parser` and `main`.

``python -m specjax.cli`` runs `main` (``__main__.py``), as does the ``specjax``
console script.
"""

from specjax.cli.common import UserError as UserError
from specjax.cli.parser import build_parser as build_parser
from specjax.cli.parser import main as main
