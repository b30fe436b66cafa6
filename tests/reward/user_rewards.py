"""Reward functions as a user writes them (``reward.function``), TRL-style, for tests/reward/test_functions.py.

Each is called as ``f(prompts=[problem, ...], completions=[response, ...], id=[...], answer=[...], <column>=[...])``
and returns one value per completion. The well-behaved ones give values that are easy to check by hand; the others
fail in one way each (raise, wrong length, NaN, inf, not a number, hang).
"""
from __future__ import annotations

import json
import time


def quarter(prompts, completions, **columns):
    """0.25 for every completion."""
    return [0.25] * len(completions)


def seven_tenths(prompts, completions, **columns):
    """0.7 for every completion."""
    return [0.7 for _ in completions]


def length_tenths(prompts, completions, **columns):
    """len(completion) / 10: "abc" -> 0.3, "abcdef" -> 0.6."""
    return [len(c) / 10 for c in completions]


def matches_answer(prompts, completions, answer, **columns):
    """1.0 when the completion is the row's answer, else 0.0."""
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]


def none_on_question_mark(prompts, completions, **columns):
    """``None`` (cannot grade) for a completion ending in '?', else 0.4."""
    return [None if c.endswith("?") else 0.4 for c in completions]


def always_none(prompts, completions, **columns):
    return [None] * len(completions)


def by_difficulty(prompts, completions, id, answer, difficulty, **columns):
    """difficulty / 10 when the completion is the answer, else 0; reads the extra column ``difficulty``."""
    return [d / 10 if c.strip() == str(a) else 0.0 for c, a, d in zip(completions, answer, difficulty)]


def record(prompts, completions, **columns):
    """Writes what it was called with to the file named by the first row's ``log`` column; returns 0.5 each."""
    with open(columns["log"][0], "w") as f:
        json.dump({"prompts": prompts, "completions": completions, "columns": columns}, f, sort_keys=True)
    return [0.5] * len(completions)


def numpy_values(prompts, completions, **columns):
    """A numpy array (what a vectorised function returns): 0.125 each."""
    import numpy as np
    return np.full(len(completions), 0.125, dtype=np.float32)


# ----------------------------------------------------------------------------- the broken ones

def raises(prompts, completions, **columns):
    raise ValueError("cannot parse completion 2")


def one_short(prompts, completions, **columns):
    return [0.5] * (len(completions) - 1)


def nan_second(prompts, completions, **columns):
    return [0.5, float("nan")] + [0.5] * (len(completions) - 2)


def inf_first(prompts, completions, **columns):
    return [float("inf")] + [0.5] * (len(completions) - 1)


def word_values(prompts, completions, **columns):
    return ["high"] * len(completions)


def returns_scalar(prompts, completions, **columns):
    return 1.0


def dict_of_rewards(prompts, completions, **columns):
    """{index: reward}: iterating it would give the keys [0, 1], not the rewards [1.0, 0.0]."""
    return {i: float(i == 0) for i in range(len(completions))}


def digit_string(prompts, completions, **columns):
    """A string of digits, one per completion: iterating it gives '1', '0' -- text, not numbers."""
    return "10"[: len(completions)]


def digit_strings(prompts, completions, **columns):
    return ["1"] * len(completions)


def nested_lists(prompts, completions, **columns):
    return [[0.5] for _ in completions]


def bools(prompts, completions, **columns):
    return [c.endswith("c") for c in completions]


def generator(prompts, completions, **columns):
    return (0.5 for _ in completions)


def hangs(prompts, completions, **columns):
    time.sleep(60)
    return [1.0] * len(completions)


def hangs_on_slow(prompts, completions, **columns):
    """Hangs when a completion is "slow", else 0.9 each."""
    if "slow" in completions:
        time.sleep(60)
    return [0.9] * len(completions)


def by_level(prompts, completions, answer, level, **columns):
    """level / 4 when the completion is the answer, else 0 (a file's own ``level`` column; CSV cells are text)."""
    return [float(lv) / 4 if c.strip() == str(a) else 0.0 for c, a, lv in zip(completions, answer, level)]


def hoards_memory(prompts, completions, **columns):
    """Holds ~600 MiB (touched, so resident) for 3 s, then 0.5 each."""
    block = bytearray(600 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(3)
    return [0.5] * len(completions)
