"""``graft store info PATH`` / ``graft store export PATH OUT.jsonl [--model M]``: the command of
:mod:`graft.storage.trajectory_store` (the store's layout and schema are there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from graft.commands.parsers import store_parser
from graft.config import run_success_threshold
from graft.storage.trajectory_store import StoreError, export_jsonl, info


def _human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _print_info(d: dict) -> None:
    steps = "none" if d["steps"] is None else f"{d['steps'][0]}..{d['steps'][1]} ({d['files']} files)"
    print(f"store:          {d['path']}")
    print(f"schema version: {d['schema_version']}")
    print(f"run ids:        {', '.join(d['run_ids']) or '-'}")
    print(f"steps:          {steps}")
    print(f"rows:           {d['rows']}")
    print(f"size on disk:   {_human_size(d['size_bytes'])}")
    if not d["models"]:
        return
    header = ("model", "tokenizer", "rows", "prompts", "steps", "reward rate")
    lines = [header] + [
        (name, m["tokenizer"], str(m["rows"]), str(m["prompts"]), f"{m['steps'][0]}..{m['steps'][1]}", f"{m['reward_rate']:.3f}")
        for name, m in d["models"].items()
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print()
    for line in lines:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def store_threshold(path: str | Path) -> float:
    """The ``reward.success_threshold`` of the run a store belongs to: the ``config.yaml`` of the run folder given, or
    of the folder holding the store (or the step file) given; the default when none is found."""
    p = Path(path)
    for folder in (p, p.parent, p.parent.parent):
        if (folder / "config.yaml").is_file():
            return run_success_threshold(folder)
    return run_success_threshold(p)


def store_main(argv: list[str]) -> int:
    """``graft store info PATH`` / ``graft store export PATH OUT.jsonl [--model M]``; argv excludes ``store``."""
    try:
        args = store_parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage error
        return int(e.code or 0)
    try:
        if args.cmd == "info":
            d = info(args.path, store_threshold(args.path))
            if args.json:
                print(json.dumps(d, indent=1))
            else:
                _print_info(d)
        else:
            n = export_jsonl(args.path, args.out, args.model)
            print(f"wrote {n} rows to {args.out}")
    except (StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
