"""The grading half of a toy third task domain (tests/trainer/test_user_task.py), as a user would write it.

Kept free of graft imports: the grader's worker processes import it by name (``verify_fn``), and a worker
forked from graft's forkserver then starts in milliseconds.
"""
from __future__ import annotations

INSTRUCTION = "Reply with the name of one toy."
FEWSHOT = (("Name a toy that rolls.", "A ball."),)


def toy_reference(row) -> str:
    """The reference of a data row: ``toy:`` and its answer (``toy:19``)."""
    return f"toy:{row['answer']}"


def toy_verify(response: str, reference: str) -> tuple[float, str]:
    """(len(response) % 5) / 4 -- 0, 0.25, 0.5, 0.75 or 1 -- when the reference is a toy one; an empty response is
    ``no_answer``. Anything but a ``toy:`` reference is an error (it would mean another domain's rows)."""
    if not reference.startswith("toy:"):
        return 0.0, "error"
    if not response.strip():
        return 0.0, "no_answer"
    return (len(response) % 5) / 4, "ok"
