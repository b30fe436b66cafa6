"""Stop strings end a sampled response at the first occurrence (tokens, log-probs and text)."""
from graft.config import ModelConfig
from graft.types import Sample
from graft.policy.prompts import cut_at_stop

VOCAB = {1: " 2 + 2 = 4.", 2: " \\boxed{4}", 3: "\n", 4: "Problem:", 5: " What", 6: " \\boxed{9}"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def test_cut_at_first_stop_string():
    s = Sample(token_ids=[1, 2, 3, 4, 5, 6], logprobs=[-1, -2, -3, -4, -5, -6], text=decode([1, 2, 3, 4, 5, 6]), finished=False)
    out = cut_at_stop(s, decode, ["\nProblem:"])
    # "\nProblem:" is complete after token 4: keep tokens 1..4, text before the stop string
    assert out.token_ids == [1, 2, 3, 4] and out.logprobs == [-1, -2, -3, -4]
    assert out.text == " 2 + 2 = 4. \\boxed{4}" and out.finished
    # the invented next problem's \boxed{9} is gone, so it cannot be graded


def test_no_stop_string_leaves_sample_alone():
    s = Sample(token_ids=[1, 2], logprobs=[-1, -2], text=decode([1, 2]), finished=True)
    assert cut_at_stop(s, decode, ["\nProblem:"]) is s
    assert cut_at_stop(s, decode, []) is s


def test_default_stops_follow_template():
    assert ModelConfig(name="a", path="x", template="chat").stop_strings() == []
    assert ModelConfig(name="a", path="x", template="fewshot").stop_strings() == ["\nProblem:"]
    assert ModelConfig(name="a", path="x", template="plain", stop=["###"]).stop_strings() == ["###"]
