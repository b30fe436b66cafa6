"""Prompt templates, BOS handling and response tokenization."""
from __future__ import annotations

import pytest

from dataclasses import replace

from graft.policy.codec import TextCodec

from graft.config import ConfigError, ModelConfig
from graft.domains.math import FEWSHOT_EXAMPLES
from graft.policy.prompts import encode_prompt, frame_response, instruction_of, render_prompt

PROBLEM = "What is 17 + 25?"


def test_chat_template_smollm2(tiny_llama_policy):
    tok = tiny_llama_policy.tokenizer
    cfg = ModelConfig(path="x", template="chat")
    text = render_prompt(cfg, tok, PROBLEM)
    assert text.endswith("<|im_start|>assistant\n")  # generation prompt
    assert f"<|im_start|>user\n{PROBLEM}\n{instruction_of(cfg)}<|im_end|>" in text
    ids = encode_prompt(tok, text)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids.count(tok.bos_token_id) == text.count("<|im_start|>")
    assert ids[-2:] == tok("assistant\n", add_special_tokens=False)["input_ids"][-2:]


def test_chat_template_fewshot_turns(tiny_llama_policy):
    tok = tiny_llama_policy.tokenizer
    cfg = ModelConfig(path="x", template="chat", fewshot=2)
    text = render_prompt(cfg, tok, PROBLEM)
    # 2 example exchanges, then the problem: 3 user turns and 2 assistant answers before the generation prompt
    assert text.count("<|im_start|>user\n") == 3 and text.count("<|im_start|>assistant\n") == 3
    for q, a in FEWSHOT_EXAMPLES[:2]:
        assert f"<|im_start|>user\n{q}\n{instruction_of(cfg)}<|im_end|>" in text
        assert f"<|im_start|>assistant\n{a}<|im_end|>" in text
    assert text.index(FEWSHOT_EXAMPLES[1][1]) < text.index(PROBLEM)
    assert text.endswith(f"<|im_start|>user\n{PROBLEM}\n{instruction_of(cfg)}<|im_end|>\n<|im_start|>assistant\n")


def test_shots_default_per_template():
    assert ModelConfig(path="x", template="fewshot").num_shots() == 2
    assert ModelConfig(path="x", template="chat").num_shots() == 0
    assert ModelConfig(path="x", template="plain").num_shots() == 0
    assert ModelConfig(path="x", template="chat", fewshot=3).num_shots() == 3
    with pytest.raises(ConfigError, match="plain"):
        ModelConfig(path="x", template="plain", fewshot=2)
    with pytest.raises(ConfigError, match=">= 0"):
        ModelConfig(path="x", template="fewshot", fewshot=-1)


def test_chat_template_needs_chat_tokenizer(tiny_gemma_policy):
    with pytest.raises(ConfigError, match="plain or fewshot"):
        render_prompt(ModelConfig(path="x", template="chat"), tiny_gemma_policy.tokenizer, PROBLEM)


def test_plain_template(tiny_llama_policy):
    text = render_prompt(ModelConfig(path="x", template="plain"), tiny_llama_policy.tokenizer, PROBLEM)
    assert text == f"Problem: {PROBLEM}\nPut your final answer within \\boxed{{}}.\nSolution:"
    text = render_prompt(ModelConfig(path="x", template="plain", instruction=""), tiny_llama_policy.tokenizer, PROBLEM)
    assert text == f"Problem: {PROBLEM}\nSolution:"


@pytest.mark.parametrize("k", [0, 1, 3, len(FEWSHOT_EXAMPLES)])
def test_fewshot_template(tiny_llama_policy, k):
    cfg = ModelConfig(path="x", template="fewshot", fewshot=k)
    text = render_prompt(cfg, tiny_llama_policy.tokenizer, PROBLEM)
    assert text.count("Problem: ") == k + 1 and text.count("\\boxed{") == 2 * k + 1  # instruction in every block + k answers
    assert text.endswith(f"Problem: {PROBLEM}\n{instruction_of(cfg)}\nSolution:")
    for q, a in FEWSHOT_EXAMPLES[:k]:
        assert q in text and a in text and "\\boxed{" in a


def test_fewshot_too_many():
    with pytest.raises(ConfigError, match="fewshot"):
        render_prompt(ModelConfig(path="x", template="fewshot", fewshot=len(FEWSHOT_EXAMPLES) + 1), None, PROBLEM)


def test_bos_gemma_exactly_once(tiny_gemma_policy):
    tok = tiny_gemma_policy.tokenizer
    ids = tiny_gemma_policy.codec.encode_prompt(PROBLEM)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    # a text that already carries the BOS string (as chat templates write it) gets no second one
    ids2 = encode_prompt(tok, tok.bos_token + "Problem: hi")
    assert ids2[0] == tok.bos_token_id and ids2[1] != tok.bos_token_id
    assert ids[-1] != tok.eos_token_id


def test_bos_smollm2_plain_has_none(tiny_llama_policy):
    tok = tiny_llama_policy.tokenizer
    ids = tiny_llama_policy.codec.encode_prompt(PROBLEM)
    assert tok.bos_token_id not in ids  # SmolLM2 adds no BOS; its chat template writes <|im_start|> itself
    assert tiny_llama_policy.decode(ids) == tiny_llama_policy.codec.render_prompt(PROBLEM)


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_encode_response_round_trip(which, tiny_llama_policy, tiny_gemma_policy, monkeypatch):
    """A text already framed as the template frames it encodes and decodes unchanged."""
    pol = tiny_llama_policy if which == "llama" else tiny_gemma_policy
    template = "fewshot" if which == "gemma" else "chat"
    monkeypatch.setattr(pol, "codec", TextCodec(replace(pol.cfg, template=template, stop=[]), pol.tokenizer))
    text = "First, 17 + 25 = 42.\n\nSo the answer is \\boxed{42}."
    text = " " + text if template == "fewshot" else text
    ids = pol.codec.encode_response(text, finished=False)
    assert pol.decode(ids) == text
    ids_f = pol.codec.encode_response(text, finished=True)
    assert ids_f == ids + [pol.eos_token_id]   # no stop strings: EOS
    assert pol.decode(ids_f) == text  # EOS is special: stripped
    assert pol.codec.encode_response("", finished=True) == [pol.eos_token_id]
    assert pol.codec.encode_response(pol.decode(ids), finished=False) == ids


# (peer text, finished, template, stops) -> (framed text, append EOS)
FRAMES = [
    # a Gemma few-shot answer handed to a chat model: surrounding whitespace dropped, EOS appended
    (" 3 + 4 = 7. The final answer is \\boxed{7}.\n", True, "chat", [], ("3 + 4 = 7. The final answer is \\boxed{7}.", True)),
    (" 3 + 4 = 7", False, "chat", [], ("3 + 4 = 7", False)),
    # a chat answer handed to a few-shot model: one space after "Solution:", then a blank line and the
    # stop string, as between the worked examples; no EOS
    ("3 + 4 = 7. \\boxed{7}.", True, "fewshot", ["\nProblem:"], (" 3 + 4 = 7. \\boxed{7}.\n\nProblem:", False)),
    ("3 + 4 = 7", False, "fewshot", ["\nProblem:"], (" 3 + 4 = 7", False)),      # cut at max_new_tokens: as is
    ("\\boxed{7}", True, "plain", ["</answer>"], (" \\boxed{7}</answer>", False)),    # a stop on the same line
    ("\\boxed{7}", True, "plain", [], (" \\boxed{7}", True)),                      # no stop strings: EOS
    ("  ", True, "fewshot", ["\nProblem:"], ("\n\nProblem:", False)),
]


@pytest.mark.parametrize("text,finished,template,stops,expected", FRAMES)
def test_frame_response(text, finished, template, stops, expected):
    assert frame_response(text, finished, template, stops) == expected


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_finished_response_ends_with_the_receivers_own_stop(which, tiny_llama_policy, tiny_gemma_policy, monkeypatch):
    """A template with stop strings ends a finished response with its first stop string, as its
    own samples end; a chat template (no stop strings) ends it with EOS."""
    pol = tiny_llama_policy if which == "llama" else tiny_gemma_policy
    text = " 17 + 25 = 42. The final answer is \\boxed{42}.\n"
    monkeypatch.setattr(pol, "codec", TextCodec(replace(pol.cfg, template="fewshot", stop=None), pol.tokenizer))
    ids = pol.codec.encode_response(text, finished=True)
    assert pol.decode(ids) == text + "\nProblem:" and pol.eos_token_id not in ids
    assert pol.decode(pol.codec.encode_response(text, finished=False)) == text.rstrip()
    monkeypatch.setattr(pol, "codec", TextCodec(replace(pol.cfg, template="chat", stop=None, fewshot=None), pol.tokenizer))
    assert pol.codec.encode_response(text, finished=True) == pol.codec.encode_response(text, finished=False) + [pol.eos_token_id]
    assert pol.decode(pol.codec.encode_response(text, finished=True)) == text.strip()
