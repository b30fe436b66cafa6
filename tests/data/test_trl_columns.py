"""TRL's column semantics: ids derived from a row's content when it has none, every column reaching the reward
functions under its own name (and under graft's name when ``data.fields`` maps it), TRL's ``prompt`` column, and
conversational prompts (a list of chat messages) rendered by a chat template and refused, before any model loads,
for a model that cannot render them.
"""
from __future__ import annotations

import hashlib
import json

import pytest

from graft.commands.cli import main
from graft.config import ConfigError, ModelConfig, load_config
from graft.data.datasets import DataError, load_prompts, prompts_fingerprint
from graft.domains.grading import load_data
from graft.policy.codec import TextCodec
from graft.policy.prompts import check_conversations
from graft.reward.functions import FunctionGrader
from graft.types import Prompt

MODELS = "models=[{name: A, path: /nowhere/a}, {name: B, path: /nowhere/b}]"
RECORD = "tests.reward.user_rewards:record"
TALK = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is 2+3?"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def config(*overrides):
    return load_config(None, [MODELS, *overrides])


def seen_by_function(prompts, completions, tmp_path):
    """What ``record`` was called with on ``prompts`` (the reward-function references) and ``completions``."""
    log = tmp_path / "seen.json"
    refs = [json.dumps(dict(json.loads(p.answer), log=str(log))) for p in prompts]
    with FunctionGrader([RECORD], workers=0) as g:
        g.grade(completions, refs)
    return json.loads(log.read_text())


# ----------------------------------------------------------------------------- ids from the row

def test_rows_without_ids_get_ids_from_their_content(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": 4}])
    prompts, _ = load_prompts(path)
    # canonical JSON (sorted keys, no spaces): '{"answer":"2","problem":"1+1?"}', whose sha256 begins 5651de1ebe73;
    # '{"answer":4,"problem":"2+2?"}' (4 a number, as in the file) -> 1bc037e51003
    assert hashlib.sha256(b'{"answer":"2","problem":"1+1?"}').hexdigest()[:12] == "5651de1ebe73"
    assert hashlib.sha256(b'{"answer":4,"problem":"2+2?"}').hexdigest()[:12] == "1bc037e51003"
    assert prompts == [Prompt("row-5651de1ebe73", "1+1?", "2"), Prompt("row-1bc037e51003", "2+2?", "4")]


def test_identical_rows_are_numbered_and_the_same_file_gives_the_same_ids(tmp_path):
    same, other = {"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4", "id": "mine"}
    path = write_jsonl(tmp_path / "d.jsonl", [same, other, same, {"answer": "2", "problem": "1+1?"}])
    prompts, _ = load_prompts(path)
    # the 2nd and 3rd copies of the row (key order does not matter) are -2 and -3; a row with an id keeps it
    assert [p.id for p in prompts] == ["row-5651de1ebe73", "mine", "row-5651de1ebe73-2", "row-5651de1ebe73-3"]
    again, _ = load_prompts(path)
    assert prompts_fingerprint(again) == prompts_fingerprint(prompts)   # what a resume checks
    assert [p.id for p in load_prompts(path, limit=3)[0]] == [p.id for p in prompts[:3]]


def test_a_null_id_is_no_id_but_a_mapped_id_column_must_be_there(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": None, "problem": "1+1?", "answer": "2"}])
    # {"answer":"2","id":null,"problem":"1+1?"}: the row as read, its null id included
    assert load_prompts(path)[0][0].id == "row-" + hashlib.sha256(
        b'{"answer":"2","id":null,"problem":"1+1?"}').hexdigest()[:12]
    with pytest.raises(DataError, match=r"line 1: missing column 'qid' \(data.fields.id\)"):
        load_prompts(path, fields={"id": "qid"})


# ----------------------------------------------------------------------------- what reward functions get

def test_a_mapped_column_reaches_the_function_under_its_own_name_and_graft_s(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "What is 2+3?", "solution": "5", "level": 1},
                                              {"question": "What is 4*5?", "solution": "20", "level": 2}])
    cfg = config("data.fields={problem: question, answer: solution}", f"reward.function={RECORD}")
    prompts, _ = load_data(path, cfg)
    seen = seen_by_function(prompts, ["5", "21"], tmp_path)
    assert seen["prompts"] == ["What is 2+3?", "What is 4*5?"]          # graft's problem is `prompts`, as in TRL
    columns = seen["columns"]
    assert columns["question"] == seen["prompts"] and "problem" not in columns      # ... and `question` too
    assert columns["solution"] == columns["answer"] == ["5", "20"]      # own name and graft's name
    assert columns["level"] == [1, 2] and columns["id"] == [p.id for p in prompts]
    assert set(columns) == {"question", "solution", "answer", "level", "id", "log", "completion_ids"}


def test_trl_prompt_column_is_the_problem(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "What is 2+3?", "answer": "5"}])
    prompts, _ = load_prompts(path)
    assert (prompts[0].problem, prompts[0].messages) == ("What is 2+3?", None)
    # an explicit problem column wins over a prompt column; data.fields.problem wins over both
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "p", "problem": "q", "text": "t", "answer": "5"}])
    assert load_prompts(path)[0][0].problem == "q"
    assert load_prompts(path, fields={"problem": "text"})[0][0].problem == "t"
    with pytest.raises(DataError, match=r"line 1: missing field\(s\) \['problem'\] \(or 'prompt'\)"):
        load_prompts(write_jsonl(tmp_path / "f.jsonl", [{"question": "q", "answer": "5"}]))


# ----------------------------------------------------------------------------- conversations

def test_a_list_of_chat_messages_is_a_conversation(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": TALK, "solution": "five"}])
    prompts, _ = load_data(path, config(f"reward.function={RECORD}"))
    p = prompts[0]
    assert p.problem == "What is 2+3?" and p.messages == tuple(TALK)   # the problem text: the last user message
    seen = seen_by_function(prompts, ["five"], tmp_path)
    assert seen["prompts"] == [TALK]                                     # the messages, as TRL passes them
    assert seen["completions"] == [[{"role": "assistant", "content": "five"}]]
    assert "prompt" not in seen["columns"] and seen["columns"]["solution"] == ["five"]
    # the messages are part of the data's fingerprint: another system message is other data
    other = [dict(TALK[0], content="Answer in two words."), TALK[1]]
    changed, _ = load_data(write_jsonl(tmp_path / "e.jsonl", [{"prompt": other, "solution": "five"}]),
                           config(f"reward.function={RECORD}"))
    assert changed[0].problem == p.problem and prompts_fingerprint(changed) != prompts_fingerprint(prompts)


@pytest.mark.parametrize("talk,message", [
    ([{"role": "user"}], "prompt: message 0 must be a dict with a text role and content, got {'role': 'user'}"),
    ([{"role": "system", "content": "s"}], "prompt: a conversation needs a user message, its last one with some"),
    ([{"role": "user", "content": "q"}, {"role": "user", "content": " "}],
     "prompt: a conversation needs a user message, its last one with some text"),
    ([{"role": "user", "content": [{"type": "text", "text": "q"}]}], "prompt: message 0 must be a dict with a text role"),
    (["What is 2+3?"], "prompt must be a non-empty string or a list of chat messages, got ['What is 2+3?']"),
])
def test_a_bad_conversation_is_one_line_naming_the_row(tmp_path, talk, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": TALK, "answer": "5"}, {"prompt": talk, "answer": "5"}])
    with pytest.raises(DataError) as e:
        load_prompts(path)
    assert str(e.value).startswith(f"{path}, line 2: {message}") and "\n" not in str(e.value), str(e.value)
    assert load_prompts(path, on_bad_row="skip")[1]["skipped_reasons"] == {"bad_problem": 1}


def test_a_conversation_renders_through_the_chat_template_as_written(tiny_llama_dir):
    codec = TextCodec.load(ModelConfig(name="A", path=tiny_llama_dir, template="chat"))
    text = codec.render_prompt("What is 2+3?", tuple(TALK))
    # SmolLM2's chat template: each message framed by <|im_start|>ROLE\n ... <|im_end|>\n, then the assistant's
    # turn opened; no instruction appended, no worked example
    assert text == ("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert codec.encode_prompt("What is 2+3?", tuple(TALK)) == codec.tokenizer(text, add_special_tokens=False)["input_ids"]
    # the same problem as text keeps its prompt of today: the template's default system turn, one user turn with the
    # domain's instruction
    assert codec.render_prompt("What is 2+3?") == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?\nPut your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("model,why", [
    ({"template": "plain"}, "its template is 'plain'; conversations need template: chat (models.1.template)"),
    ({"template": "fewshot"}, "its template is 'fewshot'; conversations need template: chat (models.1.template)"),
    ({"template": "chat", "fewshot": 1}, "it shows 1 worked examples (models.1.fewshot); set models.1.fewshot=0"),
    ({"template": "chat", "instruction": "Be brief."}, "it sets models.1.instruction; write it into the messages instead"),
])
def test_a_model_that_cannot_render_a_conversation_is_refused_in_one_line(model, why):
    models = [ModelConfig(name="A", path="/nowhere", template="chat"), ModelConfig(name="B", path="/nowhere", **model)]
    prompts = [Prompt("t1", "text", "1"), Prompt("c1", "What is 2+3?", "5", tuple(TALK))]
    with pytest.raises(ConfigError) as e:
        check_conversations(models, prompts, "data.train")
    assert str(e.value) == (f"data.train: prompt 'c1' is a conversation (a list of chat messages, rendered as written), "
                            f"which model B cannot take: {why}")
    check_conversations(models, prompts[:1], "data.train")               # text prompts: every template renders them
    check_conversations(models[:1], prompts, "data.train")               # a chat model without examples: fine


def test_train_refuses_a_conversation_for_a_plain_model_before_any_model_loads(tmp_path, capsys):
    data = write_jsonl(tmp_path / "talk.jsonl", [{"prompt": TALK, "answer": "5"}])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"run_dir: {tmp_path / 'run'}\nmodels:\n  - {{name: A, path: /nowhere/a, template: chat}}\n"
                   f"  - {{name: B, path: /nowhere/b, template: plain}}\ndata: {{train: {data}}}\nbatch_prompts: 1\nupdate: {{num_minibatches: 1}}\n")
    assert main(["train", str(cfg)]) == 2                                 # /nowhere is never looked at
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: data.train: prompt 'row-") and "model B cannot take" in err[0]
    assert "its template is 'plain'" in err[0] and not (tmp_path / "run").exists()
