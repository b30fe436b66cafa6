"""``data.*``: where the prompts come from; each procedural task brings its own settings section
(:mod:`graft.data.tasks`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from graft.config.checks import Accepts, Sections, check, check_choices
from graft.registry import BAD_ROWS, TASKS


def is_rows(value: Any) -> bool:
    """An in-memory dataset: a list (or tuple) of mappings, a ``datasets.Dataset`` or a pandas ``DataFrame``."""
    if isinstance(value, (list, tuple)):
        return all(isinstance(r, Mapping) for r in value)
    kind = type(value)
    return (kind.__module__.split(".")[0], kind.__name__) in {("datasets", "Dataset"), ("pandas", "DataFrame")}


Rows = Annotated[Any, Accepts(is_rows, "an in-memory dataset (a datasets.Dataset, a pandas DataFrame or a list of dicts)")]
"""What ``data.train`` / ``data.val`` take from Python besides a source's name (``graft.train(cfg, train_dataset=...)``)."""


@dataclass
class DataConfig:
    train: str | Rows = "arithmetic"
    """Training prompts: ``arithmetic`` (the procedural task), ``code_task`` (the procedural code task), a
    ``.jsonl``/``.parquet``/``.csv``/``.tsv``/``.json`` file, a folder saved by ``datasets`` (``folder[:split]``), or
    ``hub:NAME[:split]`` for a Hugging Face dataset; rows ``{id, problem, answer}`` (or ``tests`` for code), other
    column names mapped by ``fields``. From Python, also an in-memory dataset (a ``datasets.Dataset``, a pandas
    ``DataFrame`` or a list of dicts)."""
    val: str | Rows | None = None
    """Validation set for in-training evaluation (same forms as ``train``); ``None`` disables it."""
    val_limit: int | None = None
    """Use only the first ``val_limit`` validation prompts."""
    on_bad_row: Annotated[str, BAD_ROWS] = "error"
    """A malformed row stops the run (``error``) or is skipped and counted (``skip``)."""
    tasks: Annotated[dict[str, Any], Sections(TASKS)] = field(default_factory=lambda: Sections(TASKS).defaults())
    """The settings of every procedural task (:class:`graft.data.tasks.Task`), each under the task's own name: a config
    writes ``data.arithmetic``, ``data.code_task``, ... in this place."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch (seeded by ``seed`` and the epoch number)."""
    fields: dict[str, str] = field(default_factory=dict)
    """graft's column names -> your file's (``{problem: question, answer: solution, tests: test_list}``); graft's
    names are id, problem, answer, tests, entry_point. Every column is kept and reaches the reward functions under its
    own name (a mapped one under graft's name too); a row without an id gets one derived from its content, and one
    without a problem column takes TRL's prompt column (graft.data.datasets)."""

    def __getattr__(self, name: str) -> Any:
        """A task's settings section by the task's name (``cfg.data.arithmetic``)."""
        tasks = self.__dict__.get("tasks") or {}
        if name in tasks:
            return tasks[name]
        raise AttributeError(f"{type(self).__name__} has no field or task section {name!r}")

    def __post_init__(self) -> None:
        check_choices(self)
        check(
            not isinstance(self.train, str) or bool(self.train.strip()),
            "train",
            "is required (arithmetic, a data file or folder, or hub:NAME)",
        )
        bad = [k for k in self.fields if k not in ("id", "problem", "answer", "tests", "entry_point")]
        check(not bad, "fields", f"{bad[:1]} is not a graft field name; map id, problem, answer, tests, entry_point")
        check(self.val_limit is None or self.val_limit > 0, "val_limit", f"must be positive, got {self.val_limit}")
