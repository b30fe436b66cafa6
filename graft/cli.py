"""``python -m graft.cli``: the ``graft`` command under its earlier module name (committed study commands and the runs
``graft sweep`` / ``graft experiment`` start use it). The command is :mod:`graft.commands.cli`."""

import sys

from graft.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
