"""load_prompts (JSONL / Parquet / hub / arithmetic, bad rows) and PromptSampler (epochs, resume)."""
import json
import sys
import types as pytypes
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graft.data.arithmetic import ArithmeticConfig
from graft.data.datasets import DataError, PromptSampler, load_prompts
from graft.types import Prompt


def write_jsonl(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


GOOD = [{"id": "a", "problem": "1+1?", "answer": "2"}, {"id": "b", "problem": "2+2?", "answer": 4},
        {"id": 7, "problem": "half?", "answer": 0.5, "extra": [1]}, {"id": "d", "problem": "AMC", "answer": 27.0}]


def test_jsonl_rows_and_conversions(tmp_path):
    prompts, stats = load_prompts(write_jsonl(tmp_path / "d.jsonl", GOOD + [""]))
    assert prompts == [Prompt("a", "1+1?", "2"), Prompt("b", "2+2?", "4"), Prompt("7", "half?", "0.5"),
                       Prompt("d", "AMC", "27")]
    assert stats["rows"] == 4 and stats["prompts"] == 4 and stats["skipped"] == 0 and stats["skipped_reasons"] == {}


BAD = [
    ("{not json", "invalid_json"),
    ('["a", "b"]', "not_an_object"),
    ({"id": "x", "problem": "p"}, "missing_field"),
    ({"id": "x", "problem": "p", "answer": None}, "bad_answer"),
    ({"id": "x", "problem": "p", "answer": ["1"]}, "bad_answer"),
    ({"id": "x", "problem": "p", "answer": {"v": 1}}, "bad_answer"),
    ({"id": "x", "problem": "p", "answer": True}, "bad_answer"),
    ({"id": "x", "problem": "p", "answer": "  "}, "empty_answer"),
    ({"id": "x", "problem": "", "answer": "1"}, "bad_problem"),
    ({"id": "  ", "problem": "p", "answer": "1"}, "bad_id"),            # (a null id is no id: one is derived)
    ({"id": "a", "problem": "again", "answer": "1"}, "duplicate_id"),
]


@pytest.mark.parametrize("bad,reason", BAD, ids=[r for _, r in BAD])
def test_bad_row_names_file_and_line(tmp_path, bad, reason):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD[0], GOOD[1], bad, GOOD[2]])
    with pytest.raises(DataError) as e:
        load_prompts(path)
    assert "d.jsonl" in str(e.value) and "line 3" in str(e.value)
    with pytest.raises(DataError) as bare:
        load_prompts(path, skip_hint="")                                           # a caller without the switch
    with pytest.raises(DataError) as own:
        load_prompts(path, skip_hint="pass --skip")
    assert str(e.value) == str(bare.value) + " (set data.on_bad_row=skip to skip bad rows)"
    assert str(own.value) == str(bare.value) + " (pass --skip)"
    prompts, stats = load_prompts(path, on_bad_row="skip")
    assert [p.id for p in prompts] == ["a", "b", "7"]
    assert stats["skipped"] == 1 and stats["skipped_reasons"] == {reason: 1} and stats["rows"] == 4


def test_line_numbers_count_blank_lines_and_skip_counts_all(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"id": "a", "problem": "p", "answer": "1"}\n\n\xff\xfe\n{"id": "a", "problem": "p", "answer": "2"}\n')
    with pytest.raises(DataError, match="line 3"):
        load_prompts(str(path))
    prompts, stats = load_prompts(str(path), on_bad_row="skip")
    assert len(prompts) == 1 and stats["skipped_reasons"] == {"invalid_json": 1, "duplicate_id": 1}


def test_empty_dataset_missing_file_and_unknown_spec(tmp_path):
    with pytest.raises(DataError, match="no usable prompts"):
        load_prompts(write_jsonl(tmp_path / "bad.jsonl", ["{", "[]"]), on_bad_row="skip")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no usable prompts"):
        load_prompts(str(empty))
    with pytest.raises(DataError, match="not found"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="expected a .jsonl, .parquet, .csv, .tsv or .json file"):
        load_prompts(str(tmp_path / "data.xlsx"))
    with pytest.raises(DataError, match="on_bad_row"):
        load_prompts("arithmetic", on_bad_row="ignore")


def test_limit_stops_reading(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", GOOD + ["{broken"])
    prompts, stats = load_prompts(path, limit=2)  # the broken last line is never read
    assert [p.id for p in prompts] == ["a", "b"] and stats["rows"] == 2


def test_parquet(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "problem": ["p", "q", "r"], "answer": ["1", None, "3"]}), path)
    with pytest.raises(DataError, match="row 2"):
        load_prompts(str(path))
    prompts, stats = load_prompts(str(path), on_bad_row="skip")
    assert [p.id for p in prompts] == ["a", "c"] and stats["skipped_reasons"] == {"bad_answer": 1}
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="Parquet"):
        load_prompts(str(tmp_path / "junk.parquet"))


def test_hub_needs_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(DataError, match="pip install datasets"):
        load_prompts("hub:HuggingFaceH4/MATH-500:test")


def test_hub_rows_via_fake_datasets(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return [{"unique_id": "u1", "problem": "p", "answer": "1"}, {"problem": "q", "answer": 2},
                {"problem": "r", "answer": None}]

    monkeypatch.setitem(sys.modules, "datasets", pytypes.SimpleNamespace(
        load_dataset=load_dataset, disable_progress_bars=lambda: None,
        logging=pytypes.SimpleNamespace(set_verbosity_error=lambda: None)))
    prompts, stats = load_prompts("hub:org/set:test", on_bad_row="skip")
    assert calls == [("org/set", "test")]
    assert prompts == [Prompt("u1", "p", "1"), Prompt("org/set:test:1", "q", "2")]
    assert stats["skipped_reasons"] == {"bad_answer": 1}
    with pytest.raises(DataError, match=r"hub:org/set:train, row 3"):
        load_prompts("hub:org/set")


def test_arithmetic_spec():
    cfg = ArithmeticConfig(num_prompts=40, max_operand=12, ops=["+", "*"], seed=3)
    prompts, stats = load_prompts("arithmetic", tasks={"arithmetic": cfg})
    assert len(prompts) == 40 and stats["prompts"] == 40 and stats["skipped"] == 0
    assert load_prompts("arithmetic", tasks={"arithmetic": cfg}, limit=5)[0] == prompts[:5]
    assert len(load_prompts("arithmetic")[0]) == ArithmeticConfig().num_prompts
    with pytest.raises(DataError, match="distinct"):
        load_prompts("arithmetic", tasks={"arithmetic": ArithmeticConfig(num_prompts=500, max_operand=3)})


def test_real_benchmark_files_load():
    from pathlib import Path
    data = Path(__file__).resolve().parents[3] / "shared" / "data"
    if not data.exists():
        pytest.skip("shared data not present")
    sizes = {f: len(load_prompts(str(data / f"{f}.jsonl"))[0]) for f in ("math500", "aime24", "aime25", "amc23", "minerva")}
    assert sizes == {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272}
    # math_train has 2 rows with an empty \boxed{} answer (data README)
    with pytest.raises(DataError, match="answer is empty"):
        load_prompts(str(data / "math_train.jsonl"))
    prompts, stats = load_prompts(str(data / "math_train.jsonl"), on_bad_row="skip")
    assert len(prompts) == 7498 and stats["skipped_reasons"] == {"empty_answer": 2}


# ----------------------------------------------------------------------------- sampler

PROMPTS = [Prompt(f"p{i}", f"q{i}", str(i)) for i in range(10)]


def draw(sampler, k):
    return [([p.id for p in b], e) for b, e in (sampler.next_batch() for _ in range(k))]


@pytest.mark.parametrize("batch_size", [1, 3, 4, 5, 10])
def test_each_epoch_covers_every_prompt_once_and_batches_have_no_repeats(batch_size):
    s = PromptSampler(PROMPTS, batch_size, seed=0)
    ids = []
    for batch, _ in draw(s, 6 * 10 // batch_size):
        assert len(batch) == batch_size and len(set(batch)) == batch_size
        ids += batch
    for e in range(6):
        assert sorted(ids[e * 10:(e + 1) * 10]) == sorted(p.id for p in PROMPTS)


def test_epochs_reshuffle_deterministically():
    a, b = draw(PromptSampler(PROMPTS, 5, seed=1), 4), draw(PromptSampler(PROMPTS, 5, seed=1), 4)
    assert a == b
    assert [x for x, _ in a[:2]] != [x for x, _ in a[2:]]  # epoch 1 is another permutation
    assert [e for _, e in a] == [0, 0, 1, 1]
    assert a != draw(PromptSampler(PROMPTS, 5, seed=2), 4)
    plain = draw(PromptSampler(PROMPTS, 4, seed=1, shuffle=False), 3)
    assert plain == [(["p0", "p1", "p2", "p3"], 0), (["p4", "p5", "p6", "p7"], 0), (["p8", "p9", "p0", "p1"], 0)]


def test_batch_crossing_the_boundary_reports_its_starting_epoch():
    s = PromptSampler(PROMPTS, 4, seed=0)
    assert [e for _, e in draw(s, 6)] == [0, 0, 0, 1, 1, 2]  # batch 3 holds p.. of epoch 0 and epoch 1


@pytest.mark.parametrize("stop", [1, 2, 3, 5, 7])
def test_resume_continues_exactly(stop):
    # 10 prompts, batches of 4: 5 batches = 20 prompts = 2 epochs, so stop=5 resumes exactly
    # at an epoch boundary; the others resume mid-epoch or after a boundary-crossing batch.
    full = draw(PromptSampler(PROMPTS, 4, seed=9), 12)
    first = PromptSampler(PROMPTS, 4, seed=9)
    head = draw(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # survives JSON (and torch.save)
    resumed = PromptSampler(PROMPTS, 4, seed=9)
    resumed.load_state_dict(state)
    assert head + draw(resumed, 12 - stop) == full


def test_resume_at_epoch_boundary_does_not_skip_an_epoch():
    s = PromptSampler(PROMPTS, 5, seed=4)
    draw(s, 2)  # exactly one epoch
    state = s.state_dict()
    assert state["pos"] == 10 and state["epoch"] == 0
    r = PromptSampler(PROMPTS, 5, seed=4)
    r.load_state_dict(state)
    assert [e for _, e in draw(r, 2)] == [1, 1]
    assert draw(r, 1) == draw(s, 3)[2:]


def test_state_rejects_other_prompts_or_seed():
    s = PromptSampler(PROMPTS, 4, seed=0)
    with pytest.raises(ValueError, match="different prompt set"):
        PromptSampler(PROMPTS[:9], 4, seed=0).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="seed"):
        PromptSampler(PROMPTS, 4, seed=1).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="exceeds"):
        PromptSampler(PROMPTS, 11, seed=0)
    with pytest.raises(ValueError, match="unique"):
        PromptSampler(PROMPTS + PROMPTS[:1], 2, seed=0)


def test_large_run_balance():
    s = PromptSampler([Prompt(str(i), "q", "1") for i in range(7)], 3, seed=5)
    counts = Counter(i for b, _ in draw(s, 70) for i in b)  # 210 draws = 30 epochs
    assert set(counts.values()) == {30}
