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


def test_grade_on_code_shows_the_sandbox_and_the_held_out_detector(tmp_path, capsys):
    from graft.reward import sandbox
    if not sandbox._probe("bwrap")[0]:
        import pytest
        pytest.skip("bwrap is not usable here")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "c1", "problem": "Write f(x): 2 * x.", "entry_point": "f",
                                "tests": ["assert f(1) == 2", "assert f(-3) == -6"],
                                "fresh_tests": ["assert f(500) == 1000"]}) + "\n")
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps({"id": "c1", "response": f"```python\ndef f(x):\n    return {body}\n```"}) + "\n"
                                 for body in ("2 * x", "2 * x if x < 100 else 0", "x + 1")))
    argv = ["grade", str(REPO / "configs" / "code.yaml"), "--responses", str(responses), "--data", str(data), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["reward"], r["status"], r["flags"]) for r in rows] == [
        (1.0, "ok", []), (1.0, "holdout_fail", ["holdout_fail"]), (0.0, "wrong_answer", [])]
    assert "grading: code programs run in the bwrap sandbox" in err
    assert "flags among the rewarded {'holdout_fail': 1}" in err
