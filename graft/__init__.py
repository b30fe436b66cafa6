"""GRAFT: cross-model trajectory exchange for RLVR.

The Python API (docs/python-api.md), as TRL users work::

    import graft
    cfg = graft.load_config("default", overrides=["steps=20"])
    run = graft.train(cfg, reward_funcs=[my_reward], train_dataset=rows, callbacks=[print_step])
    run.metrics[-1], run.summary

Its names come from :mod:`graft.api` on first use, so ``import graft`` stays instant (no torch) and the package's
bottom layer imports nothing of graft.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

API = ("Config", "ConfigError", "Run", "StopTraining", "load_config", "load_run", "train", "validate")
"""The names ``graft.NAME`` gives (from :mod:`graft.api`)."""


def __getattr__(name: str) -> Any:
    if name in API:
        return getattr(importlib.import_module("graft.api"), name)
    raise AttributeError(f"module 'graft' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
