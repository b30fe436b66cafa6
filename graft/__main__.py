"""``python -m graft``: the ``graft`` command (:mod:`graft.commands.cli`)."""

import sys

from graft.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
