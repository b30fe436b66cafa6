"""Step-0 probe of a config's models on its training task — now ``graft probe`` (:mod:`graft.commands.probe`).

    python scripts/probe_task.py configs/default.yaml --prompts 64 [--compat] [key=value ...]

Kept so that commands quoted in results/ and older notes still run; it takes the same options.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

from graft.commands.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["probe", *sys.argv[1:]]))
