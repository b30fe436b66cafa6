"""The base of every error that means bad input or an unusable environment, not a bug."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (a config, a data file, a model path, a run folder) or an environment that cannot run it.
    ``graft`` prints its message as one ``error:`` line and exits 2, without a traceback; the message
    names what is wrong and, where it can, what to do."""
