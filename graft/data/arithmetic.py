"""The embedded default task: seeded procedural arithmetic problems.

``make_arithmetic(512, 30, ["+", "-", "*"], 1234)`` gives 512 distinct problems such as
``Prompt("arith-00017", "What is 17 + 25?", "42")``. The same arguments give the same
problems, ids and order on every run and platform (``random.Random(seed)`` with integer
draws only). Subtraction puts the larger operand first, so answers are never negative.

The wording of a problem is :func:`format_problem`'s ``style``; the default pair of
models should solve roughly 5-90% of a batch for GRPO groups to carry signal, so the
phrasing is a tuning knob. The ``\\boxed{}`` instruction is added by the prompt template,
not here.
"""
from __future__ import annotations

import random

from graft.types import Prompt

OPS = ("+", "-", "*")
_WORDS = {"+": "plus", "-": "minus", "*": "times"}
_LATEX = {"+": "+", "-": "-", "*": r"\times"}
_UNICODE = {"+": "+", "-": "-", "*": "×"}

STYLES: dict[str, str] = {
    "question": "What is {a} {op} {b}?",
    "times": "What is {a} {op_unicode} {b}?",
    "words": "What is {a} {op_word} {b}?",
    "compute": "Compute ${a} {op_latex} {b}$.",
    "calculate": "Calculate {a} {op} {b}.",
}
"""Named phrasings. ``{a}``/``{b}`` are the operands; ``{op}`` is ``+ - *``, ``{op_word}`` is
plus/minus/times, ``{op_latex}`` is ``+ - \\times``, ``{op_unicode}`` is ``+ - ×``."""

DEFAULT_STYLE = "question"


def format_problem(a: int, op: str, b: int, style: str = DEFAULT_STYLE) -> str:
    """The problem text of ``a op b`` in ``style``: a name from :data:`STYLES` or a format
    string using the same fields (e.g. ``"Add {a} and {b}."``)."""
    template = STYLES.get(style, style)
    if "{a}" not in template or "{b}" not in template:
        raise ValueError(f"unknown arithmetic style {style!r}: use one of {sorted(STYLES)} "
                         "or a format string with {a}, {b} and an operator field")
    return template.format(a=a, b=b, op=op, op_word=_WORDS[op], op_latex=_LATEX[op], op_unicode=_UNICODE[op])


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_arithmetic(num_prompts: int, max_operand: int, ops: list[str] | tuple[str, ...], seed: int,
                    style: str = DEFAULT_STYLE) -> list[Prompt]:
    """``num_prompts`` distinct problems ``a op b`` with operands in [0, max_operand].

    Ids are ``arith-00000``, ``arith-00001``, ... in generation order. Raises ``ValueError``
    when fewer than ``num_prompts`` distinct problems exist for these operands and operators.
    """
    ops = list(ops)
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops must be a non-empty list drawn from {OPS}, got {ops}")
    ops = sorted(set(ops), key=OPS.index)  # order-insensitive: ["*", "+"] == ["+", "*"]
    n = max_operand + 1
    per_op = {"+": n * n, "*": n * n, "-": n * (n + 1) // 2}  # "-" is ordered: a >= b
    available = sum(per_op[op] for op in ops)
    if num_prompts > available:
        raise ValueError(f"only {available} distinct problems exist with max_operand={max_operand} and ops={ops}; "
                         f"asked for {num_prompts}")
    rng = random.Random(seed)
    if 2 * num_prompts > available:  # dense: sample from the full list instead of rejecting
        everything = [(a, op, b) for op in ops for a in range(n) for b in range(n) if op != "-" or a >= b]
        triples = rng.sample(everything, num_prompts)
    else:
        seen: set[tuple[int, str, int]] = set()
        triples = []
        while len(triples) < num_prompts:
            op = ops[rng.randrange(len(ops))]
            a, b = rng.randrange(n), rng.randrange(n)
            if op == "-" and a < b:
                a, b = b, a
            if (a, op, b) not in seen:
                seen.add((a, op, b))
                triples.append((a, op, b))
    width = max(5, len(str(num_prompts - 1)))
    return [Prompt(id=f"arith-{i:0{width}d}", problem=format_problem(a, op, b, style), answer=str(_value(a, op, b)))
            for i, (a, op, b) in enumerate(triples)]
