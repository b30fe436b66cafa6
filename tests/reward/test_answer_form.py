"""``reward.answer_form=number``: a box must hold a number written out.

Found in the mini reproduction (results/mini-repro, docs/history.md): under GRPO Gemma-3-270M learnt
to restate the question inside the box (``What is 27 * 18?`` -> ``\\boxed{27*18}``), which
math_verify evaluates to the reference and scores 1. With ``number`` these score 0 while every
written-out number is still graded by the usual rule.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from graft.config import load_config
from graft.reward.verifier import exact_number, is_number, quick_verify, verify, verify_number
from graft.config import RewardConfig
from graft.domains.grading import make_grader
from graft.reward.worker import NUMBER_VERIFY_FN

# (boxed content, reference, reward under "any", reward under "number"); actual responses of the run
CASES = [
    ("27*18", "486", 1.0, 0.0),             # 27 * 18 = 486, evaluated by math_verify
    ("117 \\div 9", "13", 1.0, 0.0),        # 117 / 9 = 13
    ("36^2", "1296", 1.0, 0.0),             # 36 * 36 = 1296
    ("17+29", "46", 1.0, 0.0),              # the word form "seventeen plus twenty-nine"
    ("5-", "5", 0.0, 0.0),                  # not an answer either way
    ("486", "486", 1.0, 1.0),
    ("-12", "-12", 1.0, 1.0),
    ("1,000", "1000", 1.0, 1.0),
    ("\\frac{3}{4}", "0.75", 1.0, 1.0),     # a fraction written out is a number
    ("3/4", "\\frac{3}{4}", 1.0, 1.0),
    ("8.7e8", "870000000", 1.0, 1.0),       # scientific notation, rewritten exactly
    ("485", "486", 0.0, 0.0),
    # issue 20: what the strict rule closes (seen in results/mini-repro-number's eval files)
    ("192/4", "48", 1.0, 0.0),              # "What is 192 divided by 4?": 192 / 4 = 48, the question restated
    ("96/2", "48", 1.0, 0.0),               # = 48 too, but not in lowest terms as a written answer
    ("\\frac{192}{4}", "48", 1.0, 0.0),     # the same in LaTeX
    ("48.0", "48", 1.0, 0.0),               # an integer reference takes an integer
    ("6/8", "\\frac{3}{4}", 1.0, 0.0),      # 6/8 = 3/4, but not reduced (gcd 2)
    ("0.75", "3/4", 1.0, 1.0),              # a non-integer reference: a decimal is fine
    ("27 \\times 18", "486", 1.0, 0.0),     # 27 x 18 = 486
    ("+48", "48", 1.0, 1.0),
]


@pytest.mark.parametrize("content,answer,any_,number", CASES)
def test_rewards_by_answer_form(content, answer, any_, number):
    response = f"The final answer is \\boxed{{{content}}}."
    assert verify(response, answer)[0] == any_
    assert verify_number(response, answer)[0] == number
    quick = quick_verify(response, answer, number_only=True)
    assert quick is None or quick[0] == number          # the parent's shortcut agrees


# (response, reference, reward under "number"): one final answer only
HEDGES = [
    ("\\boxed{117} or \\boxed{228}", "228", 0.0),                  # "Which is larger: 117 or 228?" hedged
    ("\\boxed{228} or \\boxed{117}", "228", 0.0),                  # either order: the first box is right here
    ("12 + 17 = \\boxed{29}, 29 - 9 = \\boxed{20}", "20", 0.0),    # an intermediate result boxed too
    ("So \\boxed{20}. The final answer is \\boxed{20}.", "20", 1.0),  # the same answer twice is one answer
    ("\\boxed{20} and \\boxed{20.0}", "20", 0.0),                 # 20.0 is not how an integer is written
    ("\\boxed{192/4} = \\boxed{48}", "48", 0.0),                  # the question restated, then the value
]


@pytest.mark.parametrize("response,answer,number", HEDGES)
def test_number_rule_takes_exactly_one_final_answer(response, answer, number):
    assert verify_number(response, answer) == (number, "ok")
    assert quick_verify(response, answer, number_only=True) == (number, "ok")


def test_exact_number_reads_value_and_form():
    from fractions import Fraction
    assert exact_number("1,000") == (1000, "integer")
    assert exact_number("-12") == (-12, "integer")
    assert exact_number("0.75") == (Fraction(3, 4), "decimal")
    assert exact_number("\\frac{7}{12}") == (Fraction(7, 12), "fraction")
    assert exact_number("14/6") == (Fraction(7, 3), "unreduced")      # gcd(14, 6) = 2
    assert exact_number("8/1") == (8, "unreduced")                    # a denominator of 1 is not lowest terms
    assert exact_number("8.7e8") == (870000000, "integer")            # scientific notation, exactly
    assert exact_number("3/0") is None and exact_number("27*18") is None and exact_number("x") is None


def test_is_number_reads_only_written_out_numbers():
    assert all(is_number(x) for x in ("0", "+7", "3.25", ".5", "$42$", "12,345", "\\dfrac{1}{2}"))
    assert not any(is_number(x) for x in ("2+3", "6\\times7", "\\sqrt{2}", "x=5", "5 books", "10^3", ""))


def test_no_box_is_still_no_answer():
    assert verify_number("I think 486", "486") == (0.0, "no_answer")


@pytest.mark.parametrize("workers", [0, 1])
def test_grader_uses_the_number_rule_in_process_and_in_workers(workers):
    responses = ["\\boxed{27*18}", "\\boxed{486}", "\\boxed{2.5\\times 2}", "\\boxed{5}"]
    with make_grader(RewardConfig(domain="number", timeout_s=10, workers=workers)) as g:
        rewards, statuses = g.grade(responses, ["486", "486", "5", "5"])
    assert rewards == [0.0, 1.0, 0.0, 1.0] and statuses == ["ok"] * 4
    with make_grader(RewardConfig(domain="math", timeout_s=10, workers=workers)) as g:
        assert g.grade(responses, ["486", "486", "5", "5"])[0] == [1.0, 1.0, 1.0, 1.0]


def test_config_choice_is_checked_and_reaches_the_trainer(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    from graft.config import ConfigError
    from graft.trainer import loop
    from tests.trainer.helpers import tiny_config

    with pytest.raises(ConfigError, match="reward.answer_form: 'numbers' is not one of any, number"):
        load_config(None, ["reward.answer_form=numbers"])
    with pytest.raises(ConfigError, match="reward.domain: unknown domain 'numbers'; valid: math, number, code"):
        load_config(None, ["reward.domain=numbers"])
    default = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
    assert load_config(default, ["reward.answer_form=any"]).reward.domain == "math"    # the earlier key, translated
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "reward.domain=number"))
    try:
        assert run.grader.verify_fn == NUMBER_VERIFY_FN
    finally:
        run.grader.close()


def test_answers_the_number_domain_can_never_reward_are_said_at_load():
    """`twelve`, `nan`, `1e999`, `\\sqrt{2}`: no box holding a number written out equals them, so those prompts can
    only score 0; one warning line names them (the math domain checks nothing: math_verify may match them)."""
    from graft.config import RewardConfig
    from graft.domains.grading import unrewardable
    from graft.types import Prompt

    prompts = [Prompt(id=f"r{i}", problem="?", answer=a) for i, a in
               enumerate(["12", "twelve", "3/4", "nan", "1e999", "-0.5", "\\sqrt{2}", "1,000"])]
    line = unrewardable(RewardConfig(domain="number"), prompts, "data.train")
    assert line == ("warning: data.train: 4 of 8 rows have an answer the number domain can never reward ('twelve' "
                    "(id r1), 'nan' (id r3), '1e999' (id r4), ...); those prompts can only score 0")
    assert unrewardable(RewardConfig(domain="number"), prompts[:1], "data.train") is None
    assert unrewardable(RewardConfig(domain="math"), prompts, "data.train") is None
