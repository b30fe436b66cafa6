"""The boxed-answer domains: ``math`` (``math_verify`` equivalence) and ``number`` (the strict number rule).

A row is ``{id, problem, answer}``; the reference is the answer as text. A response scores 1 when its last
``\\boxed{}`` matches (:mod:`graft.reward.verifier`); the monitor is :mod:`graft.reward.shortcuts`' (an operator,
a fraction, an operand of the question or several boxes in a rewarded answer, a copied worked example, the
question echoed).
"""

from __future__ import annotations

import functools

from graft.domains.base import Domain
from graft.registry import DOMAINS
from graft.reward import shortcuts, verifier, worker

FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is 57 - 38?", "57 - 38 = 19. The final answer is \\boxed{19}."),
    ("What is 41 * 3?", "41 * 3 = 123. The final answer is \\boxed{123}."),
    ("What is 45 - 18 + 9?", "From left to right: 45 - 18 = 27, then 27 + 9 = 36. The final answer is \\boxed{36}."),
    ("What is 12 + 7 * 3?", "Multiplication comes first: 7 * 3 = 21. Then 12 + 21 = 33. The final answer is \\boxed{33}."),
    (
        "A box holds 6 rows of 8 eggs. If 5 eggs are broken, how many eggs are not broken?",
        "The box holds 6 * 8 = 48 eggs. Without the broken ones, 48 - 5 = 43 remain. The final answer is \\boxed{43}.",
    ),
    ("Solve for x: 3x - 4 = 11.", "Add 4 to both sides: 3x = 15. Divide by 3: x = 5. The final answer is \\boxed{5}."),
    ("What is 15% of 80?", "15% of 80 is 0.15 * 80 = 12. The final answer is \\boxed{12}."),
    ("Compute 1/4 + 1/3.", "With the common denominator 12: 3/12 + 4/12 = 7/12. The final answer is \\boxed{\\frac{7}{12}}."),
    (
        "What is (9 - 4) * (2 + 6)?",
        "The brackets give 9 - 4 = 5 and 2 + 6 = 8, so the product is 5 * 8 = 40. The final answer is \\boxed{40}.",
    ),
    (
        "The sum of two consecutive integers is 27. What is the larger one?",
        "Call them n and n + 1. Then 2n + 1 = 27, so n = 13 and the larger is 14. The final answer is \\boxed{14}.",
    ),
)
"""(problem, worked solution) pairs of the ``fewshot`` template: fixed generic arithmetic/algebra problems, so a
run's prompts never depend on its training data."""

WORKED_EQUATIONS = shortcuts.worked_equations([a for _, a in FEWSHOT_EXAMPLES])
"""The equations of the worked examples (``57 - 38 = 19``): a response repeating one copied an example
(the reward monitor's ``example_copy``)."""

INSTRUCTION = "Put your final answer within \\boxed{}."


def _flags(response: str, problem: str, reference: str) -> dict[str, bool]:
    return shortcuts.answer_flags(response, problem, WORKED_EQUATIONS)


MATH = DOMAINS.register(
    "math",
    Domain(
        verify_fn=worker.DEFAULT_VERIFY_FN,
        instruction=INSTRUCTION,
        fewshot=FEWSHOT_EXAMPLES,
        flags=shortcuts.FLAGS,
        flag_fn=_flags,
        quick=functools.partial(verifier.quick_verify, number_only=False),
    ),
)
"""The last box is equivalent to the reference by ``math_verify`` (MATH-style answers: fractions, radicals,
intervals)."""

NUMBER = DOMAINS.register(
    "number",
    Domain(
        verify_fn=worker.NUMBER_VERIFY_FN,
        instruction=INSTRUCTION,
        fewshot=FEWSHOT_EXAMPLES,
        flags=shortcuts.FLAGS,
        flag_fn=_flags,
        quick=functools.partial(verifier.quick_verify, number_only=True),
        rewardable=lambda reference: verifier.exact_number(reference) is not None,
    ),
)
"""As ``math``, and the box must hold a number written out: restating an arithmetic question in the box
(``\\boxed{27*18}``) or hedging over several boxes scores 0 (:func:`graft.reward.verifier.verify_number`)."""
