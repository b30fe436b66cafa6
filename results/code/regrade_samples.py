"""Re-grade the programs a recorded run's ``graft samples`` files show, with today's tests of the same functions.

    python results/code/regrade_samples.py results/code/graft16/samples_rewarded.txt results/code/graft16/samples_peer.txt

Every sample of the files (``-- step S · MODEL · ID · answer {...} · reward R`` then ``Q:`` and ``A:`` lines) is
graded again by the code reward as it is now (:func:`graft.reward.code.verify_code`, in the sandbox): the row's
function (its id's family and entry point) gets today's tests and fresh tests (``make_code_task``'s edge classes
and random inputs, drawn from the sample's position as seed), and the response its reward and status. Printed: one
line per sample (the recorded reward, the new reward and status, the program on one line), then the counts.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graft.data.code_task import FRESH_TESTS, TESTS_PER_PROMPT, _pick, spec_of  # noqa: E402
from graft.reward.code import code_reference, verify_code  # noqa: E402

HEAD = re.compile(r"^-- step (\d+) · (\S+) (?:(?:→|->) \S+ )?· (\S+) · answer (\{.*\}) · reward (\S+)$")


def samples(path: Path) -> list[dict]:
    """The samples of one ``graft samples`` output: id, model, step, recorded reward, entry point, response."""
    out: list[dict] = []
    for line in path.read_text().splitlines():
        head = HEAD.match(line)
        if head:
            step, model, pid, answer, reward = head.groups()
            entry = json.loads(answer)["entry_point"]
            out.append({"id": pid, "model": model, "step": int(step), "reward": float(reward), "entry": entry, "lines": []})
        elif out and line.startswith(("A: ", "   ")) and not line.startswith("Q:"):
            out[-1]["lines"].append(line[3:])
    for s in out:
        s["response"] = "\n".join(s.pop("lines")).strip("\n")
    return out


def todays_row(sample: dict, seed: int) -> dict:
    """The sample's function with today's tests (edge classes, then random inputs) and fresh tests."""
    spec = spec_of({"id": sample["id"], "entry_point": sample["entry"]})
    rng = random.Random(seed)
    seen: set[str] = set()
    tests = _pick(spec, rng, spec.edges(rng), TESTS_PER_PROMPT, seen, sample["id"])
    fresh = _pick(spec, rng, [], FRESH_TESTS, seen, sample["id"])
    return {"id": sample["id"], "problem": "", "entry_point": spec.name, "tests": tests, "fresh_tests": fresh}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for path in args.files:
        tally: Counter = Counter()
        print(f"## {path}")
        for i, s in enumerate(samples(path)):
            reward, status = verify_code(s["response"], code_reference(todays_row(s, i)), timeout_s=8.0)
            tally[(s["reward"] > 0.5, reward > 0.5, status)] += 1
            program = " ".join(s["response"].split("```python")[-1].split("```")[0].split())
            head = f"{s['id']:22s} {s['model']:8s} step {s['step']:2d}"
            print(f"{head}  recorded {s['reward']:g} -> now {reward:g} {status:16s} {program[:110]}")
        print("counts (recorded rewarded, rewarded now, status):", dict(sorted(tally.items(), key=str)), "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
