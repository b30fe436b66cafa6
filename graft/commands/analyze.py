"""``graft analyze RUN_DIR [--against RUN_DIR2] [--json]``: the command of :mod:`graft.evaluation.analyze` (the
numbers and their definitions are there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from graft.commands.parsers import analyze_parser
from graft.console import say
from graft.evaluation.analyze import AnalysisError, analyze, summary_text


def analyze_main(argv: Sequence[str] | None = None) -> int:
    """``graft analyze RUN_DIR [--against RUN_DIR2] [--json]``; returns the exit status."""
    args = analyze_parser().parse_args(argv)
    try:
        a = analyze(args.run_dir, args.against)
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if type(e).__name__ == "StoreError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    print(json.dumps(a, indent=1) if args.json else summary_text(a))
    say(f"\nwritten: {Path(args.run_dir) / 'analysis.json'}")
    return 0
