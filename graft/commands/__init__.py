"""The command layer: every ``graft`` command's entry point and argument parser, on top of the library (nothing
below imports it). :mod:`graft.commands.cli` is the ``graft`` command and its table of commands
(:data:`~graft.commands.cli.COMMANDS`); :mod:`graft.commands.parsers` holds the parsers, importing no torch, so that
``graft COMMAND --help`` is instant. A command module reads its arguments, calls the library and prints; what it
computes lives in the layers below (``graft analyze``'s numbers in :mod:`graft.evaluation.analyze`, ``graft store``'s
reader in :mod:`graft.storage.trajectory_store`, ...)."""
