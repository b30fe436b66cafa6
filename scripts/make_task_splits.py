"""Held-out evaluation splits of a config's procedural task — now ``graft splits`` (:mod:`graft.commands.splits`).

    python scripts/make_task_splits.py configs/default.yaml --out results/mini-repro/data --test 64 --hard 64

Kept so that the commands recorded in configs/experiments/*.yaml and STUDY.md still run; it takes the same options.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

from graft.commands.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["splits", *sys.argv[1:]]))
