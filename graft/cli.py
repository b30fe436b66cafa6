"""``python -m graft.cli``: the ``graft`` command (:mod:`graft.commands.cli`) as a module, as the committed study commands
and the runs ``graft sweep`` / ``graft experiment`` start invoke it."""

import sys

from graft.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
