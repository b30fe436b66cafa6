"""Re-grade the programs a recorded run's ``graft samples`` files show, with today's tests of the same prompts.

    python results/code/regrade_samples.py results/code/graft16/samples_rewarded.txt \
        results/code/graft16/samples_peer.txt > results/code/graft16/regraded.txt

Every sample of the files (``-- step S · MODEL [-> MODEL] · ID · answer {...} · reward R [· flags: ...]`` then ``Q:``
and ``A:`` lines) is graded again by the code reward as it is now (:func:`graft.reward.code.verify_code`, in the
sandbox) on the row today's generator makes for that prompt: the same id (its index), function (its family and entry
point) and example (read off the ``Q:`` line), with the run's task seed (``--seed``): its tests and fresh tests are
those ``make_code_task`` makes today for that question at that index. (Today's generator may ask another question at
that index, as its draws changed; where it asks the same one, the two rows are checked to be equal.) Printed: one line
per sample (the recorded reward, the new reward and status, the program on one line), then the counts per file.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graft.data.code_task import FRESH_TESTS, TESTS_PER_PROMPT, _row, make_code_task, spec_of  # noqa: E402
from graft.data.tasks import family_of  # noqa: E402
from graft.reward.code import code_reference, verify_code  # noqa: E402

HEAD = re.compile(r"^-- step (\d+) · (\S+) (?:(?:→|->) \S+ )?· (\S+) · answer (\{.*\}) · reward (\S+)(?: · flags: .*)?$")
EXAMPLE = re.compile(r"For example, (\w+)\((.*)\) returns (.*)\.$")


def samples(path: Path) -> list[dict]:
    """The samples of one ``graft samples`` output: id, model, step, recorded reward, entry point, the problem's
    example arguments, response. A line that starts with ``-- `` but is no sample's head stops the script."""
    out: list[dict] = []
    for line in path.read_text().splitlines():
        head = HEAD.match(line)
        if head:
            step, model, pid, answer, reward = head.groups()
            entry = json.loads(answer)["entry_point"]
            out.append({"id": pid, "model": model, "step": int(step), "reward": float(reward), "entry": entry, "lines": []})
        elif line.startswith("-- "):
            raise SystemExit(f"{path}: not a sample's head: {line[:80]}")
        elif out and line.startswith("Q: "):
            example = EXAMPLE.search(line)
            assert example and example.group(1) == out[-1]["entry"], line
            out[-1]["example"] = ast.literal_eval(f"({example.group(2)},)")
        elif out and line.startswith(("A: ", "   ")):
            out[-1]["lines"].append(line[3:])
    for s in out:
        s["response"] = "\n".join(s.pop("lines")).strip("\n")
    return out


def todays_row(sample: dict, seed: int) -> dict:
    """The row today's generator makes for the sample's prompt: its index, function and example, task seed ``seed``
    (today's tests: edge classes, then random inputs; and fresh tests)."""
    spec = spec_of({"id": sample["id"], "entry_point": sample["entry"]})
    index = sample["id"].rsplit("-", 1)[1]
    return _row(family_of(sample["id"]), int(index), len(index), spec, sample["example"], TESTS_PER_PROMPT, FRESH_TESTS, seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--seed", type=int, default=1234, help="the run's data.code_task.seed")
    ap.add_argument("--num-prompts", type=int, default=256, help="the run's data.code_task.num_prompts")
    args = ap.parse_args(argv)
    today = {row["id"]: row for row in make_code_task(args.num_prompts, args.seed)}
    for path in args.files:
        tally: Counter = Counter()
        same = 0
        print(f"## {path}")
        for s in samples(path):
            row = todays_row(s, args.seed)
            if today.get(row["id"], {}).get("problem") == row["problem"]:
                assert today[row["id"]] == row, row["id"]
                same += 1
            reward, status = verify_code(s["response"], code_reference(row), timeout_s=8.0, success_threshold=0.5)
            tally[(s["reward"] > 0.5, reward > 0.5, status)] += 1
            program = " ".join(s["response"].split("```python")[-1].split("```")[0].split())
            head = f"{s['id']:22s} {s['model']:8s} step {s['step']:2d}"
            print(f"{head}  recorded {s['reward']:g} -> now {reward:g} {status:16s} {program[:110]}")
        print(f"{same} of {sum(tally.values())} samples ask today's question of their index (rows checked equal)")
        print("counts (recorded rewarded, rewarded now, status):", dict(sorted(tally.items(), key=str)), "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
