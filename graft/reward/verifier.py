"""Single-item answer checking: the last ``\\boxed{}`` of a response against a reference.

This module is deliberately light (``math_verify`` + ``sympy``, no torch) because it is
what every grader worker process imports; :mod:`graft.reward.grader` wraps it with the
hard per-item timeout.

Rule (spec §3.1): reward 1 iff the content of the **last** ``\\boxed{...}`` (or
``\\fbox{...}``) of the response is equivalent to the reference answer according to
``math_verify``; no boxed answer scores 0 with status ``no_answer``. Details:

* The predicted answer is parsed from ``\\boxed{<content>}`` alone, so an earlier boxed
  value can never be picked up when the last one fails to parse, and nothing outside the
  box counts (``$x = \\boxed{5}$`` -> ``5``; ``$\\boxed{2} + 3$`` -> ``2``).
* The reference is wrapped as ``\\boxed{<answer>}`` before parsing, so plain answers
  without ``$`` delimiters parse as LaTeX (unwrapped, ``math_verify`` reads
  ``1 - \\sqrt{2}`` as ``1``). If that yields no expression (``-1./3``) the raw answer is
  parsed as a plain expression instead.
* Scientific notation at the start of an answer (``8.7e8``, ``6E-3``,
  ``8.7 \\times 10^{8}``, ``3\\cdot10^6``) is rewritten to an exact integer or fraction on
  both sides first. ``math_verify`` alone reads ``8.7e8`` as ``8.7 * E * 8`` (Euler's
  number) and fails ``8.7 \\times 10^{8}`` against ``870000000``.
* Two shortcuts that agree with ``math_verify`` and skip it: identical answers
  (whitespace collapsed) score 1, and two plain integers are compared as integers
  (``025`` == ``25``, the AIME case).
* ``math_verify``'s own SIGALRM timeouts are disabled (``parsing_timeout=None``,
  ``timeout_seconds=None``): they only work on the main thread. The caller bounds the time.

Known ``math_verify`` behaviour kept as is: floats are compared after rounding to 6
decimals (``1/3`` == ``0.3333333`` but not ``0.333``; tiny numbers like ``1.2e-9`` written
as decimals compare equal to any other tiny decimal); units in ``\\text{}``/``\\mathrm{}``
and ``^\\circ`` are dropped; ``\\%`` is kept as /100 but ``12`` == ``12\\%`` still matches;
``x = 5`` matches ``5``; intervals must agree on open/closed ends.
"""

from __future__ import annotations

import functools
import logging
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from math import gcd

# Status strings; equal to graft.types.VERIFY_* (not imported: graft.types pulls in torch,
# which grader workers must not import). tests/reward checks they stay equal.
OK = "ok"
TIMEOUT = "timeout"
NO_ANSWER = "no_answer"
ERROR = "error"
INTERRUPTED = "interrupted"
"""Answered by a verify function whose item a stop signal reached mid-way (the code sandbox's, when a cluster stops
the job): the grader grades the item again, once (:mod:`graft.reward.grader`); the status stays only when the
second grading answers it too."""


class _DropTimeoutDisabledWarning(logging.Filter):
    """math_verify warns once per process that its timeout is off; we bound time ourselves."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())

_mv = None  # lazily imported math_verify pieces: (parse, verify, gold_cfg, pred_cfg, expr_cfg)


def _math_verify():
    global _mv
    if _mv is None:
        # deferred: math_verify (sympy, antlr) takes seconds to import, and number answers never need it
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify as mv_verify

        # Default LaTeX normalisation (malformed_operators=True reads "11\sqrt2"; the README's
        # reward config with malformed_operators=False fails on it), boxed answers first.
        latex = LatexExtractionConfig(boxed_match_priority=0)
        expr = ExprExtractionConfig()
        _mv = (parse, mv_verify, [latex, expr], [latex], [expr])
    return _mv


# ----------------------------------------------------------------------------- extraction

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


_BRACE_RE = re.compile(r"\\.|[{}]", re.S)
_TOKEN_RE = re.compile(r"[^\s$]+")


def _brace_pairs(text: str) -> dict[int, int]:
    """``{position of "{": position of its "}"}`` for every closed brace of ``text``, in one pass (escaped braces
    ``\\{`` ``\\}`` and ``\\\\`` skipped), so that reading every box is linear in the text, not quadratic in
    unclosed ``\\boxed{`` (a quadratic scan takes 28-49 s over 10^4 of them)."""
    pairs, stack = {}, []
    for m in _BRACE_RE.finditer(text):
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _box_content(text: str, i: int, pairs: dict[int, int] | None = None) -> str | None:
    """Content of the box whose command ends at ``text[i]`` (see :func:`extract_boxed`), or ``None``; ``pairs``:
    :func:`_brace_pairs` of ``text`` when many boxes are read (else this box's braces are scanned)."""
    n = len(text)
    start_cmd = i
    while i < n and text[i] in " \t":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        if start_cmd == i:  # "\boxedx": not a box command we understand
            return None
        m = _TOKEN_RE.match(text, i)
        return m.group(0).rstrip(".,;") if m else None
    end = pairs.get(i) if pairs is not None else _closing_brace(text, i)
    return text[i + 1 : end].strip() if end is not None else None


def _closing_brace(text: str, i: int) -> int | None:
    """Position of the ``}`` that closes the ``{`` at ``text[i]`` (escapes skipped), or ``None``: one box's scan."""
    depth = 0
    for m in _BRACE_RE.finditer(text, i):
        c = m.group()
        depth += 1 if c == "{" else -1 if c == "}" else 0
        if depth == 0:
            return m.start()
    return None


def boxed_contents(text: str) -> list[str | None]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order (``None`` for one never
    closed); ``[]`` for no box or a non-string. Linear in the length of ``text``."""
    if not isinstance(text, str):
        return []
    ends = [m.end() for m in _BOX_RE.finditer(text)]
    pairs = _brace_pairs(text) if ends else {}
    return [_box_content(text, i, pairs) for i in ends]


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, brace-balanced and stripped.

    ``\\boxed 5`` (no braces) gives the next space-delimited token. Escaped braces ``\\{``
    ``\\}`` do not count for balancing. Returns ``None`` when there is no box, or when the
    last one is never closed (a response cut off inside its final box has no answer: an
    earlier box would be an intermediate result). An empty box gives ``""``.
    """
    if not isinstance(text, str):
        return None
    last = None
    for match in _BOX_RE.finditer(text):
        last = match
    return _box_content(text, last.end()) if last is not None else None


# ----------------------------------------------------------------------------- normalisation

_NUM = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))"
_SCI_RE = re.compile(
    r"^\s*" + _NUM + r"(?:[eE]([+-]?\d+)(?![\d.])"
    r"|\s*\\(?:times|cdot)\s*10\s*\^\s*(?:\{\s*([+-]?\d+)\s*\}|([+-]?\d)))"
)
_INT_RE = re.compile(r"^[+-]?\d{1,60}$")


def _exact(d: Decimal) -> str:
    """Exact LaTeX of a decimal: an integer, or a reduced \\frac."""
    num, den = d.as_integer_ratio()
    return str(num) if den == 1 else rf"\frac{{{num}}}{{{den}}}"


def normalize_answer(s: str) -> str:
    """Trim ``$`` delimiters and rewrite a leading scientific-notation number exactly.

    ``8.7e8`` -> ``870000000``; ``6e-3`` -> ``\\frac{3}{500}``;
    ``8.7 \\times 10^{8} \\text{ m}`` -> ``870000000 \\text{ m}``. Anything else is unchanged.
    """
    s = s.strip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    m = _SCI_RE.match(s)
    if m:
        exp = m.group(2) or m.group(3) or m.group(4)
        try:
            d = Decimal(m.group(1)).scaleb(int(exp))
        except (InvalidOperation, ValueError, OverflowError):
            return s
        if abs(int(exp)) <= 400:
            s = _exact(d) + s[m.end() :]
    return s


def _has_expr(parsed: list) -> bool:
    return any(not isinstance(x, str) for x in parsed)


# Parses are cached per process: a group's G responses share one reference, and identical
# responses are common. Parsing dominates the cost (up to seconds for long formulas).
@functools.lru_cache(maxsize=4096)
def _parse_gold(g: str) -> list:
    parse, _, gold_cfg, _, expr_cfg = _math_verify()
    parsed = parse("\\boxed{" + g + "}", extraction_config=gold_cfg, parsing_timeout=None)
    if not _has_expr(parsed):
        raw = parse(g, extraction_config=expr_cfg, parsing_timeout=None)
        if _has_expr(raw):
            parsed = raw
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_pred(p: str) -> list:
    parse, _, _, pred_cfg, _ = _math_verify()
    return parse("\\boxed{" + p + "}", extraction_config=pred_cfg, parsing_timeout=None)


def _shortcut(p: str, g: str) -> bool | None:
    """Decide normalised answers without math_verify when that is safe, else ``None``."""
    if not p or not g:
        return False
    if " ".join(p.split()) == " ".join(g.split()):
        return True
    if _INT_RE.match(p) and _INT_RE.match(g):
        return int(p) == int(g)
    return None


def answers_match(pred: str, gold: str) -> bool:
    """True iff predicted answer text ``pred`` (a box's content) is equivalent to ``gold``."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    quick = _shortcut(p, g)
    if quick is not None:
        return quick
    return _equivalent(p, g)


@functools.lru_cache(maxsize=8192)
def _equivalent(p: str, g: str) -> bool:
    """math_verify on normalised texts (cached: wrong answers repeat within a group)."""
    # Argument order matters: gold first (math_verify is asymmetric for intervals/relations).
    return bool(_math_verify()[1](_parse_gold(g), _parse_pred(p), timeout_seconds=None))


_NUMBER_RE = re.compile(
    r"^[+-]?(?:\d+(?:\.\d+)?|\.\d+|\d{1,3}(?:,\d{3})+(?:\.\d+)?"
    r"|\\[dt]?frac\{\d+\}\{\d+\}|\d+/\d+)$"
)


def is_number(content: str) -> bool:
    """Whether a box's content is a number written out (``-12``, ``3.5``, ``1,000``, ``\\frac{3}{4}``,
    ``3/4``; scientific notation after :func:`normalize_answer`), not an expression to evaluate
    (``27*18``, ``36^2``, ``117 \\div 9``). Used by the answer-form monitor; the reward's own rule is
    :func:`exact_number`."""
    return bool(_NUMBER_RE.match(normalize_answer(content).replace(" ", "")))


_EXACT_RE = re.compile(
    r"^(?P<sign>[+-]?)(?:(?P<int>\d+|\d{1,3}(?:,\d{3})+)(?:\.(?P<dec>\d+))?|\.(?P<dec0>\d+)"
    r"|\\[dt]?frac\{(?P<fn>\d+)\}\{(?P<fd>\d+)\}|(?P<sn>\d+)/(?P<sd>\d+))$"
)


def exact_number(content: str) -> tuple[Fraction, str] | None:
    """The exact value of a number written out, and how it is written: ``"integer"``, ``"decimal"``
    or ``"fraction"`` (``\\frac{a}{b}``, ``a/b``, in any terms); ``None`` for anything else.

    ``"-12"`` -> (-12, integer); ``"1,000"`` -> (1000, integer); ``"0.75"`` -> (3/4, decimal);
    ``"6/8"`` -> (3/4, fraction); ``"8.7e8"`` -> (870000000, integer) via :func:`normalize_answer`;
    ``"27*18"``, ``"48.0.1"``, ``"x"`` -> None.
    """
    m = _EXACT_RE.match(normalize_answer(content).replace(" ", ""))
    if not m:
        return None
    sign = -1 if m["sign"] == "-" else 1
    if m["fn"] is not None or m["sn"] is not None:
        num, den = (int(m["fn"]), int(m["fd"])) if m["fn"] is not None else (int(m["sn"]), int(m["sd"]))
        if den == 0:
            return None
        form = "fraction" if gcd(num, den) == 1 and den != 1 else "unreduced"
        return sign * Fraction(num, den), form
    whole = int((m["int"] or "0").replace(",", ""))
    dec = m["dec"] if m["dec"] is not None else m["dec0"]
    if dec is None:
        return Fraction(sign * whole), "integer"
    return sign * (whole + Fraction(int(dec), 10 ** len(dec))), "decimal"


def strict_number_match(content: str, value: Fraction) -> bool:
    """Whether a box's content is the reference ``value`` written in lowest terms: an integer
    reference as an integer (``48``, not ``48.0``, ``96/2`` or ``192/4``); any other reference as a
    decimal or a fraction whose terms have no common factor (``3/4``, ``0.75``; not ``6/8``)."""
    parsed = exact_number(content)
    if parsed is None or parsed[0] != value:
        return False
    if value.denominator == 1:
        return parsed[1] == "integer"
    return parsed[1] in ("decimal", "fraction")


def number_reward(response: str, answer: str) -> tuple[float, str] | None:
    """The ``reward.domain=number`` rule where the reference is a number, else ``None``.

    Reward 1 iff the response boxes exactly one final answer and it is the reference in lowest
    terms (:func:`strict_number_match`): every box of the response must hold it (a repeated
    ``\\boxed{48}`` is fine; ``\\boxed{117} or \\boxed{228}``, or an intermediate result boxed before
    the answer, is a hedge and scores 0). An expression (``27*18``), an unreduced or unevaluated
    fraction (``192/4`` for 48) and anything that restates the question's operands score 0.
    """
    gold = exact_number(str(answer))
    if gold is None:
        return None
    if not extract_boxed(response):  # the last box alone decides "no answer" (all boxes are read only then)
        return 0.0, NO_ANSWER
    boxes = boxed_contents(response)
    ok = all(b is not None and strict_number_match(b, gold[0]) for b in boxes)
    return (1.0 if ok else 0.0), OK


def verify(response: str, answer: str) -> tuple[float, str]:
    """Reward and status of one response: ``(1.0|0.0, ok|no_answer|error)``.

    In-process and unbounded in time (see :class:`graft.reward.grader.Grader` for the
    timeout). Never raises for ordinary exceptions: they give ``(0.0, "error")``.
    """
    try:
        content = extract_boxed(response)
        if not content:
            return 0.0, NO_ANSWER
        return (1.0 if answers_match(content, str(answer)) else 0.0), OK
    except Exception:  # noqa: BLE001 - any failure of the checker scores 0
        return 0.0, ERROR


def verify_number(response: str, answer: str) -> tuple[float, str]:
    """:func:`verify` for answers that must be numbers (``reward.domain=number``).

    Where the reference is a number (every arithmetic task), :func:`number_reward` decides without
    ``math_verify``: one final answer, the reference in lowest terms. Found in the mini
    reproductions (README Results): Gemma-3-270M learnt to restate the question in the box
    (``\\boxed{27*18}``), to box the division it was asked (``\\boxed{192/4}``) and to hedge
    (``\\boxed{117} or \\boxed{228}``); all score 0. A reference that is not a number (a data file's
    ``\\sqrt{2}``) keeps :func:`verify`'s equivalence, with a box that is not a number written out
    scoring 0.
    """
    try:
        strict = number_reward(response, answer)
        if strict is not None:
            return strict
        content = extract_boxed(response)
        if content and not is_number(content):
            return 0.0, OK
    except Exception:  # noqa: BLE001 - any failure of the checker scores 0
        return 0.0, ERROR
    return verify(response, answer)


QUICK_MAX_CHARS = 100_000
"""Longer responses skip the in-process quick check and go to a worker, under the grader's hard timeout: the
quick check has none (a generated response is ~10^4 characters at 2,048 tokens; a stored or user-supplied one is
not bounded)."""


def quick_verify(response: str, answer: str, number_only: bool = False) -> tuple[float, str] | None:
    """The cheap cases of :func:`verify` decided without ``math_verify``; ``None`` otherwise.

    Used by the grader's parent process to avoid a round trip for missing boxes, identical
    answers and integer pairs (the bulk of the arithmetic task). Agrees with :func:`verify`
    (with ``number_only``: with :func:`verify_number`, which a numeric reference decides here).
    """
    if not isinstance(response, str) or len(response) > QUICK_MAX_CHARS:
        return None
    try:
        if number_only:
            strict = number_reward(response, answer)
            if strict is not None:
                return strict
        content = extract_boxed(response)
        if not content:
            return 0.0, NO_ANSWER
        if number_only and not is_number(content):
            return 0.0, OK
        quick = _shortcut(normalize_answer(content), normalize_answer(str(answer)))
        if quick is not None:
            return (1.0 if quick else 0.0), OK
    except Exception:  # noqa: BLE001
        return None
    return None


def warm_up() -> None:
    """Import math_verify and compile its grammars/regexes (first call costs ~0.3 s)."""
    answers_match(r"\frac{1}{2}", "0.5")
