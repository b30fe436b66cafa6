"""A user's own task, end to end on the tiny models, with no edit of graft:

(a) a reward function in a file outside the project, named in one config line, drives a training run and its values
    are the rewards of metrics.jsonl and the trajectory store;
(b) a Parquet file with its own column names (``data.fields``) trains and is evaluated by ``graft eval --config``;
(c) a third task domain (a :class:`graft.domains.Domain` of the user's) picked by ``reward.domain=FILE.py:TOY`` or
    registered by name: its instruction and worked example are in the stored prompts, its verify function decides
    the rewards;
(d) a TRL dataset as it is: a JSONL file without ids whose ``prompt`` column holds chat messages, and a reward
    function reading a column by its own name, trains two chat models that hand groups to each other.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graft.commands.cli import main
from graft.config import save_config
from graft.domains import Domain
from graft.domains.grading import make_grader
from graft.policy.codec import TextCodec
from graft.commands.eval_cli import eval_main
from graft.registry import DOMAINS
from graft.reward.functions import row_reference
from graft.trainer import loop
from tests.trainer import toy_domain
from tests.trainer.helpers import tiny_config

pytestmark = pytest.mark.slow

TOY = Domain(name="toy", verify_fn="tests.trainer.toy_domain:toy_verify", instruction=toy_domain.INSTRUCTION,
             fewshot=toy_domain.FEWSHOT, make_reference=toy_domain.toy_reference)
"""The toy domain, registered by name in :func:`test_registered_toy_domain_trains`."""

SMALL = ("batch_prompts=2", "rollout.n=2", "update.num_minibatches=1", "rollout.max_new_tokens=5")


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stored(run_dir: Path) -> list[dict]:
    files = sorted((run_dir / "trajectories").glob("step_*.parquet"))
    assert files, f"no trajectories under {run_dir}"
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def train(tmp_path, cfg, *overrides) -> None:
    path = tmp_path / "cfg.yaml"
    save_config(cfg, path)
    assert main(["train", str(path), *overrides]) == 0


# ----------------------------------------------------------------------------- (a) a reward function of one's own

REWARD = """
def score(prompts, completions, **columns):
    # 0.25 for a completion of even length, 0.375 for odd: never 0 or 1, exact in binary
    return [0.25 + 0.125 * (len(c) % 2) for c in completions]
"""


def test_reward_function_file_outside_the_project_drives_training(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    f = tmp_path / "elsewhere" / "my_reward.py"          # tmp_path: not under the project, not on sys.path
    f.parent.mkdir()
    f.write_text(REWARD)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *SMALL, "reward.workers=1")   # steps=2, A and B
    train(tmp_path, cfg, f"reward.function={f}:score")
    run_dir = tmp_path / "run"
    rows = stored(run_dir)
    assert {(r["model"], r["step"]) for r in rows} == {("A", 1), ("A", 2), ("B", 1), ("B", 2)}
    for r in rows:                                         # each response got exactly the function's value
        assert r["reward"] == 0.25 + 0.125 * (len(r["response"]) % 2), r["response"]
        assert r["verify_status"] == "ok"
        assert json.loads(r["answer"])["id"] == r["prompt_id"]     # the reference is the row as JSON
    by_step = {m["step"]: m for m in metrics(run_dir)}
    assert sorted(by_step) == [1, 2]
    for step, m in by_step.items():
        for model in ("A", "B"):
            mine = [r["reward"] for r in rows if r["model"] == model and r["step"] == step]
            assert len(mine) == 4                          # 2 prompts x 2 samples
            assert m[f"{model}/reward/mean"] == pytest.approx(sum(mine) / 4, abs=1e-12)
            assert 0.25 <= m[f"{model}/reward/mean"] <= 0.375
    assert (run_dir / "config.yaml").read_text().count(f"{f}:score") == 1


# ----------------------------------------------------------------------------- (b) a file with its own column names

QA = {
    "qid": ["qa-1", "qa-2", "qa-3", "qa-4"],
    "question": ["What is 2 + 3?", "What is 4 * 5?", "What is 9 - 1?", "What is 6 + 6?"],
    "solution": ["5", "20", "8", "12"],
    "level": [1, 2, 1, 3],
}


def test_parquet_with_its_own_columns_trains_and_evaluates(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    data = tmp_path / "qa.parquet"
    pq.write_table(pa.table(QA), data)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *SMALL, "steps=1", "exchange.mode=grpo",
                      f"data.train={data}", f"data.val={data}", "data.fields={id: qid, problem: question, answer: solution}",
                      models=("A",))
    train(tmp_path, cfg)
    run_dir = tmp_path / "run"
    solution = dict(zip(QA["qid"], QA["solution"]))
    question = dict(zip(QA["qid"], QA["question"]))
    rows = stored(run_dir)
    assert len(rows) == 4 and {r["prompt_id"] for r in rows} <= set(QA["qid"])
    for r in rows:
        assert r["answer"] == solution[r["prompt_id"]] and r["problem"] == question[r["prompt_id"]]
        assert question[r["prompt_id"]] in r["prompt_text"]

    out = tmp_path / "eval"
    rc = eval_main(["--config", str(run_dir / "config.yaml"), "--n", "2", "--repeats", "1", "--max-new-tokens", "4",
                    "--out", str(out), "--no-progress", "--verify-workers", "0", "--batch-size", "8"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert results["datasets"]["val"]["num_prompts"] == 4
    records = [json.loads(line) for line in (out / "val" / "repeat_0.jsonl").read_text().splitlines()]
    assert len(records) == 4
    for rec in records:                                    # the qid ids and the solution column, through data.fields
        assert rec["id"] in solution and rec["answer"] == solution[rec["id"]], rec
        assert len(rec["rewards"]) == 2 and set(rec["statuses"]) <= {"ok", "no_answer"}


# ----------------------------------------------------------------------------- (c) a third domain

TOY_FILE = """
from graft.domains import Domain
from tests.trainer.toy_domain import FEWSHOT, INSTRUCTION, toy_reference

TOY = Domain(name="toy-file", verify_fn="tests.trainer.toy_domain:toy_verify", instruction=INSTRUCTION,
             fewshot=FEWSHOT, make_reference=toy_reference)
"""


def check_toy_run(run_dir: Path, worked_example: bool) -> None:
    rows = stored(run_dir)
    assert len(rows) == 4                                  # 2 prompts x 2 samples, one model, one step
    for r in rows:
        assert toy_domain.INSTRUCTION in r["prompt_text"]
        assert (toy_domain.FEWSHOT[0][0] in r["prompt_text"]) == worked_example
        assert r["answer"].startswith("toy:")             # the domain's reference of the row
        assert (r["reward"], r["verify_status"]) == toy_domain.toy_verify(r["response"], r["answer"])
    m = metrics(run_dir)
    assert len(m) == 1
    assert m[0]["A/reward/mean"] == pytest.approx(sum(r["reward"] for r in rows) / 4, abs=1e-12)


def test_toy_domain_from_a_file_trains(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    f = tmp_path / "toy_domain.py"
    f.write_text(TOY_FILE)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *SMALL, "steps=1", "exchange.mode=grpo",
                      f"reward.domain={f}:TOY", "reward.workers=1", "models.0.template=fewshot", "models.0.fewshot=1",
                      models=("A",))
    train(tmp_path, cfg)
    check_toy_run(tmp_path / "run", worked_example=True)


def test_registered_toy_domain_trains(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    DOMAINS.register("toy", TOY)
    try:
        cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *SMALL, "steps=1", "exchange.mode=grpo",
                          "reward.domain=toy", models=("A",))
        assert cfg.models[0].domain_name == "toy"
        train(tmp_path, cfg)
        check_toy_run(tmp_path / "run", worked_example=False)
    finally:
        DOMAINS.unregister("toy")
    assert "toy" not in DOMAINS


def test_domain_that_cannot_be_had_is_one_line(tmp_path):
    from graft.domains.base import DomainError, load_domain
    f = tmp_path / "not_a_domain.py"
    f.write_text("TOY = {'name': 'toy'}\n")
    cases = {
        f"{f}:TOY": f"reward.domain: '{f}:TOY' is a dict, not a graft.domains.Domain",
        f"{f}:MISSING": f"reward.domain: '{f}' has no attribute 'MISSING'",
        f"{tmp_path / 'absent.py'}:TOY": f"reward.domain: file not found: {tmp_path / 'absent.py'}",
        "toy": "reward.domain: unknown domain 'toy'; valid: math, number",
    }
    for spec, message in cases.items():
        with pytest.raises(DomainError) as e:
            load_domain(spec)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


# ----------------------------------------------------------------------------- on_error=zero through a hang

def test_on_error_zero_keeps_training_through_a_hanging_reward_function(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "reward.function=tests.reward.user_rewards:hangs_on_slow",
                      "reward.on_error=zero", "reward.function_timeout_s=1", "reward.workers=1")
    run = SimpleNamespace(cfg=cfg, grader=make_grader(cfg.reward), bars=False)
    group = SimpleNamespace(responses=["slow", "x"], answer=row_reference({"id": "p1", "problem": "p"}), size=2,
                            token_ids=[[1], [2]])
    try:
        loop.grade(run, [group])       # the batch scores 0 with status function_timeout, and no GraderHang stops the run
    finally:
        run.grader.close()
    assert (group.rewards, group.status) == ([0.0, 0.0], ["function_timeout", "function_timeout"])


# ----------------------------------------------------------------------------- (d) a TRL dataset and reward function

TRL_REWARD = """
def correct(prompts, completions, solution, answer, completion_ids, **columns):
    # TRL's conversational call: the messages, one assistant message per completion, the tokens; the file's own
    # column `solution` and graft's name for it (data.fields.answer) both given
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts), prompts
    assert all(c[0]["role"] == "assistant" for c in completions), completions
    assert solution == answer and "prompt" not in columns and "problem" not in columns, columns
    # float(solution) (0.75 or 1.0) when the completion's first token id is even, else 0
    return [float(s) if ids and ids[0] % 2 == 0 else 0.0 for s, ids in zip(solution, completion_ids)]
"""

OTHER_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}[assistant] {% endif %}")
"""A second chat template (model C): a receiver renders a peer's conversation in its own."""


def test_trl_conversational_dataset_without_ids_trains_and_exchanges(tmp_path, tiny_llama_dir, monkeypatch):
    other = tmp_path / "tiny_other"
    shutil.copytree(tiny_llama_dir, other)
    (other / "chat_template.jinja").write_text(OTHER_TEMPLATE)
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + {i}?"}],
             "solution": "1.0" if i % 2 else "0.75", "level": i} for i in range(4)]
    data = tmp_path / "trl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = tmp_path / "elsewhere" / "trl_reward.py"
    f.parent.mkdir()
    f.write_text(TRL_REWARD)
    rendered: list[tuple[str, str, object]] = []
    render = TextCodec.render_prompt
    monkeypatch.setattr(TextCodec, "render_prompt",
                        lambda self, problem, messages=None: rendered.append((self.name, problem, messages))
                        or render(self, problem, messages))
    models = f"models=[{{name: A, path: '{tiny_llama_dir}', lr: 1.0e-3}}, {{name: C, path: '{other}', lr: 1.0e-3}}]"
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_llama_dir, *SMALL, models, f"data.train={data}",
                      "data.fields={answer: solution}", f"reward.function={f}:correct", "reward.workers=1",
                      "exchange.balance=none")   # A fails every sample of some prompts C solves: handed over
    train(tmp_path, cfg)

    run_dir = tmp_path / "run"
    stored_rows = stored(run_dir)
    talk = {r["prompt"][1]["content"]: r for r in rows}
    codecs = {"A": TextCodec.load(cfg.models[0]), "C": TextCodec.load(cfg.models[1])}
    for r in stored_rows:
        row = talk[r["problem"]]                           # the problem: the last user message
        assert r["prompt_id"].startswith("row-") and json.loads(r["messages"]) == row["prompt"]
        assert r["prompt_text"] == codecs[r["model"]].tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=True)
        first = r["response_token_ids"][0]
        assert r["reward"] == (float(row["solution"]) if first % 2 == 0 else 0.0)   # the function's value
    assert {r["prompt_text"].startswith("[system] Be brief.") for r in stored_rows if r["model"] == "C"} == {True}
    for step, m in {m["step"]: m for m in metrics(run_dir)}.items():
        for model in ("A", "C"):
            mine = [r["reward"] for r in stored_rows if r["model"] == model and r["step"] == step]
            assert m[f"{model}/reward/mean"] == pytest.approx(sum(mine) / len(mine), abs=1e-12)
    audit = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    handed = [(a["source"], a["receiver"]) for a in audit if a["responses"]]
    assert handed, "no group was handed over: the receiver's rendering of a conversation went untested"
    ours = [(name, messages) for name, problem, messages in rendered if problem in talk]
    assert ours and all(messages == tuple(talk[p]["prompt"]) for _, p, messages in rendered if p in talk)
    assert {name for name, _ in ours} == {"A", "C"}
