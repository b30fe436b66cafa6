"""``graft report RUN_DIR [RUN_DIR ...] [--out DIR]``: the command of :mod:`graft.evaluation.report` (the report's
plots and table are there)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from graft.commands.parsers import report_parser
from graft.evaluation.analyze import AnalysisError
from graft.evaluation.report import report


def report_main(argv: Sequence[str] | None = None) -> int:
    """``graft report RUN_DIR [RUN_DIR ...] [--out DIR]``; returns the exit status."""
    args = report_parser().parse_args(argv)
    out = Path(args.out) if args.out else (Path(args.run_dirs[0]) / "report" if len(args.run_dirs) == 1 else Path("report"))
    try:
        path = report(args.run_dirs, out)
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report written: {path}")
    return 0
