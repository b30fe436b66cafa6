"""`graft grade` end to end: rows graded by the config's domain, as a run grades them."""
from __future__ import annotations

import json
from pathlib import Path

from graft.commands.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_grade_scores_each_row_with_the_configs_domain(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q1", "problem": "What is 6 * 8?", "answer": "48"},
        {"id": "q2", "problem": "What is 192 divided by 4?", "answer": "48"}]))
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q1", "response": "6 * 8 = 48. The final answer is \\boxed{48}."},
        {"id": "q2", "response": "The final answer is \\boxed{192/4}."},   # not in lowest terms: 0 under `number`
        {"id": "q1", "response": "The final answer is \\boxed{47}."}]))
    argv = ["grade", str(REPO / "configs" / "default.yaml"), "--responses", str(responses), "--data", str(data), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["reward"]) for r in rows] == [("q1", 1.0), ("q2", 0.0), ("q1", 0.0)]
    assert "3 responses graded by number: mean reward 0.333, 1 rewarded;" in err
