"""``data.fields``: a data file with its own column names, read as a run reads it
(:func:`graft.domains.grading.load_data` with a config), in every file format; the one-line errors; and with
``reward.function`` the reference of a row is all its columns as JSON, so an extra column reaches the function.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graft.config import ConfigError, load_config
from graft.data.datasets import DataError, load_prompts
from graft.domains.grading import load_data
from graft.reward.functions import FunctionGrader
from graft.types import Prompt

MODELS = "models=[{name: A, path: /nowhere/a}, {name: B, path: /nowhere/b}]"
FIELDS = "data.fields={id: qid, problem: question, answer: solution}"

COLUMNS = {
    "qid": ["a1", "a2", "a3"],
    "question": ["What is 2+3?", "What is 4*5, exactly?", "What is 9-1?"],
    "solution": ["5", "20", "8"],
    "level": [1, 2, 3],
}
EXPECTED = [Prompt("a1", "What is 2+3?", "5"), Prompt("a2", "What is 4*5, exactly?", "20"),
            Prompt("a3", "What is 9-1?", "8")]


def config(*overrides):
    return load_config(None, [MODELS, *overrides])


def write_parquet(path, columns=COLUMNS):
    pq.write_table(pa.table(columns), path)
    return str(path)


def write_delimited(path, columns=COLUMNS, sep=","):
    names = list(columns)
    rows = zip(*(columns[n] for n in names))

    def cell(v):
        v = str(v)
        return f'"{v}"' if sep == "," and "," in v else v

    path.write_text("\n".join([sep.join(names)] + [sep.join(cell(v) for v in r) for r in rows]) + "\n")
    return str(path)


def load_error(spec, *overrides) -> str:
    with pytest.raises(DataError) as e:
        load_data(spec, config(*overrides))
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ----------------------------------------------------------------------------- the formats

def test_parquet_with_its_own_column_names(tmp_path):
    spec = write_parquet(tmp_path / "own.parquet")
    prompts, stats = load_data(spec, config(FIELDS))
    assert prompts == EXPECTED                                     # level is not part of a math prompt
    assert (stats["rows"], stats["prompts"], stats["skipped"]) == (3, 3, 0)


def test_without_the_mapping_the_same_file_is_refused(tmp_path):
    spec = write_parquet(tmp_path / "own.parquet")
    assert load_error(spec) == (f"{spec}, row 1: missing field(s) ['problem'] (or 'prompt') "   # the id is optional
                                "(set data.on_bad_row=skip to skip bad rows)")


def test_a_partial_mapping_keeps_graft_names_for_the_rest(tmp_path):
    spec = write_parquet(tmp_path / "half.parquet", {"id": ["x"], "question": ["What is 1+1?"], "answer": [2]})
    prompts, _ = load_data(spec, config("data.fields={problem: question}"))
    assert prompts == [Prompt("x", "What is 1+1?", "2")]            # the integer answer 2 as text


@pytest.mark.parametrize("suffix,sep", [(".csv", ","), (".tsv", "\t")])
def test_csv_and_tsv_with_their_own_column_names(tmp_path, suffix, sep):
    spec = write_delimited(tmp_path / f"own{suffix}", sep=sep)
    prompts, stats = load_data(spec, config(FIELDS))
    assert prompts == EXPECTED                                     # "4*5, exactly?" kept whole: quoted / a tab file
    assert stats["rows"] == 3


def test_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict(COLUMNS).save_to_disk(str(folder))
    assert load_data(str(folder), config(FIELDS))[0] == EXPECTED
    msg = load_error(f"{folder}:train", FIELDS)
    assert msg == f"{folder}: a single dataset without splits; drop ':train'"


def test_saved_dataset_dict_folder_and_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "dd"
    full = datasets.Dataset.from_dict(COLUMNS)
    datasets.DatasetDict({"train": full.select([0, 1]), "test": full.select([2])}).save_to_disk(str(folder))
    assert load_data(f"{folder}:test", config(FIELDS))[0] == EXPECTED[2:]
    assert load_data(str(folder), config(FIELDS))[0] == EXPECTED[:2]          # train by default
    msg = load_error(f"{folder}:validation", FIELDS)
    assert msg == f"{folder}: no split 'validation'; it has train, test (name one as {folder}:SPLIT)"


# ----------------------------------------------------------------------------- one-line errors

def test_missing_problem_column_names_file_row_column_and_mapping(tmp_path):
    spec = write_parquet(tmp_path / "noq.parquet", {k: v for k, v in COLUMNS.items() if k != "question"})
    assert load_error(spec, FIELDS) == (f"{spec}, row 1: missing column 'question' (data.fields.problem) "
                                        "(set data.on_bad_row=skip to skip bad rows)")


def test_missing_column_in_one_row_names_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"qid": "a1", "question": "q1", "solution": "1"}) + "\n"
                    + json.dumps({"qid": "a2", "solution": "2"}) + "\n")
    assert load_error(str(path), FIELDS).startswith(f"{path}, line 2: missing column 'question' (data.fields.problem)")


def test_missing_id_column_names_the_mapping(tmp_path):
    spec = write_delimited(tmp_path / "noid.csv", {k: v for k, v in COLUMNS.items() if k != "qid"})
    assert load_error(spec, FIELDS).startswith(f"{spec}, row 1: missing column 'qid' (data.fields.id)")


def test_missing_answer_column_names_the_mapping(tmp_path):
    spec = write_parquet(tmp_path / "nosol.parquet", {k: v for k, v in COLUMNS.items() if k != "solution"})
    msg = load_error(spec, FIELDS)
    assert msg.startswith(f"{spec}, row 1: missing column 'solution' (data.fields.answer)"), msg


@pytest.mark.parametrize("column,value,message", [
    ("qid", [1.5, 2.5, 3.5], "row 1: column 'qid' (data.fields.id) must be a non-empty string, got 1.5"),
    ("question", [12, 13, 14], "row 1: column 'question' (data.fields.problem) must be a non-empty string or a list "
                               "of chat messages, got 12"),
    ("question", ["What?", "  ", "Why?"], "row 2: column 'question' (data.fields.problem) must be a non-empty string"),
])
def test_wrong_type_names_file_row_and_column(tmp_path, column, value, message):
    spec = write_parquet(tmp_path / "types.parquet", dict(COLUMNS, **{column: value}))
    assert load_error(spec, FIELDS).startswith(f"{spec}, {message}")


def test_wrong_answer_type_is_one_line_naming_the_row(tmp_path):
    spec = write_parquet(tmp_path / "lists.parquet", dict(COLUMNS, solution=[["5"], ["20"], ["8"]]))
    assert load_error(spec, FIELDS).startswith(f"{spec}, row 1: column 'solution' (data.fields.answer) must be text "
                                               "(or a number), got list ['5']")


def test_wrong_answer_type_names_the_mapped_column(tmp_path):
    spec = write_parquet(tmp_path / "lists.parquet", dict(COLUMNS, solution=[["5"], ["20"], ["8"]]))
    assert "'solution' (data.fields.answer)" in load_error(spec, FIELDS)


def test_null_in_a_row_names_that_row(tmp_path):
    spec = write_parquet(tmp_path / "null.parquet", dict(COLUMNS, solution=["5", None, "8"]))
    assert load_error(spec, FIELDS).startswith(f"{spec}, row 2: column 'solution' (data.fields.answer) must be text "
                                               "(or a number), got NoneType None")


def test_duplicate_ids_name_both_rows(tmp_path):
    spec = write_parquet(tmp_path / "dup.parquet", dict(COLUMNS, qid=["a1", "a2", "a1"]))
    assert load_error(spec, FIELDS).startswith(f"{spec}, row 3: duplicate id 'a1' (first at row 1)")


def test_bad_rows_skipped_are_counted(tmp_path):
    spec = write_parquet(tmp_path / "mixed.parquet", dict(COLUMNS, qid=["a1", "a2", "a1"], solution=["5", None, "8"]))
    prompts, stats = load_data(spec, config(FIELDS, "data.on_bad_row=skip"))
    assert prompts == EXPECTED[:1]                                 # row 2: no answer; row 3: a1 again
    assert stats["skipped"] == 2 and stats["skipped_reasons"] == {"bad_answer": 1, "duplicate_id": 1}


@pytest.mark.parametrize("name", ["empty.parquet", "empty.jsonl"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".parquet"):
        write_parquet(path, {k: v[:0] for k, v in COLUMNS.items()})   # the columns, no row
    else:
        path.write_text("")
    assert load_error(str(path), FIELDS) == f"{path}: no usable prompts (0 rows read, 0 skipped: none)"


@pytest.mark.parametrize("content", ["", "qid,question,solution\n"], ids=["empty", "header-only"])
def test_empty_csv_is_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "empty.csv"
    path.write_text(content)
    assert load_error(str(path), FIELDS).startswith(f"{path}: ")


@pytest.mark.parametrize("content", ["", "qid,question,solution\n"], ids=["empty", "header-only"])
def test_empty_csv_says_it_has_no_rows(tmp_path, content):
    path = tmp_path / "empty.csv"
    path.write_text(content)
    assert "no usable prompts (0 rows read" in load_error(str(path), FIELDS)


def test_unknown_fields_key_is_refused_at_config_load(tmp_path):
    with pytest.raises(ConfigError) as e:
        config("data.fields={prompt: question}")
    msg = str(e.value)
    assert msg.startswith("data.fields: ") and "'prompt'" in msg and "id, problem, answer" in msg and "\n" not in msg
    yaml_file = tmp_path / "cfg.yaml"
    yaml_file.write_text("models: [{name: A, path: /x}, {name: B, path: /x}]\n"
                         "data: {train: t.parquet, fields: {question: problem}}\n")   # the mapping written backwards
    with pytest.raises(ConfigError, match=r"^data\.fields: \['question'\] is not a graft field name"):
        load_config(yaml_file)


def test_unknown_fields_key_is_refused_by_the_loader_too(tmp_path):
    with pytest.raises(DataError, match=r"^data\.fields: 'prompt' is not a graft field"):
        load_prompts(write_parquet(tmp_path / "own.parquet"), fields={"prompt": "question"})


def test_csv_keeps_ids_and_answers_as_written(tmp_path):
    spec = write_delimited(tmp_path / "zeros.csv", {"qid": ["007", "7"], "question": ["a?", "b?"],
                                                    "solution": ["007", "1.50"]})
    try:
        prompts, _ = load_data(spec, config(FIELDS))
    except DataError as e:
        raise AssertionError(str(e)) from None
    assert prompts == [Prompt("007", "a?", "007"), Prompt("7", "b?", "1.50")]


# ----------------------------------------------------------------------------- with reward.function

FUNCTION = "reward.function=tests.reward.user_rewards:by_level"


def test_with_a_reward_function_the_reference_is_the_whole_row(tmp_path):
    spec = write_parquet(tmp_path / "own.parquet")
    prompts, _ = load_data(spec, config(FIELDS, FUNCTION))
    assert [(p.id, p.problem) for p in prompts] == [(p.id, p.problem) for p in EXPECTED]
    # every column under its own name, and the mapped ones under graft's names too
    assert json.loads(prompts[0].answer) == {"id": "a1", "problem": "What is 2+3?", "answer": "5", "level": 1,
                                             "qid": "a1", "question": "What is 2+3?", "solution": "5"}
    assert json.loads(prompts[2].answer) == {"id": "a3", "problem": "What is 9-1?", "answer": "8", "level": 3,
                                             "qid": "a3", "question": "What is 9-1?", "solution": "8"}


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".tsv"])
def test_an_extra_column_reaches_the_function(tmp_path, suffix):
    spec = (write_parquet(tmp_path / "own.parquet") if suffix == ".parquet"
            else write_delimited(tmp_path / f"own{suffix}", sep="," if suffix == ".csv" else "\t"))
    prompts, _ = load_data(spec, config(FIELDS, FUNCTION))
    with FunctionGrader(["tests.reward.user_rewards:by_level"], workers=0) as g:
        rewards, statuses = g.grade(["5", "20", "9"], [p.answer for p in prompts])
    # by_level = level / 4 when right: a1 "5" right, level 1 -> 0.25; a2 "20" right, level 2 -> 0.5; a3 "9" != "8" -> 0
    assert rewards == [0.25, 0.5, 0.0] and statuses == ["ok"] * 3


def test_with_a_reward_function_no_answer_column_is_needed(tmp_path):
    spec = write_parquet(tmp_path / "open.parquet", {"qid": ["o1"], "question": ["Write a haiku."], "level": [2]})
    prompts, _ = load_data(spec, config("data.fields={id: qid, problem: question}", FUNCTION))
    assert json.loads(prompts[0].answer) == {"id": "o1", "problem": "Write a haiku.", "level": 2, "qid": "o1",
                                             "question": "Write a haiku."}
    assert load_error(spec, "data.fields={id: qid, problem: question}").startswith(f"{spec}, row 1: missing")
