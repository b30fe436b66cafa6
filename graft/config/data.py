"""``data.*``: where the prompts come from, and the settings of the procedural tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.registry import BAD_ROWS, FAMILIES, STYLES


@dataclass
class ArithmeticConfig:
    num_prompts: int = 512
    """How many distinct problems the procedural task generates."""
    max_operand: int = 30
    """Operands are drawn from [0, max_operand]."""
    ops: list[str] = field(default_factory=lambda: ["+", "-", "*"])
    """Operators to draw from."""
    seed: int = 1234
    """Seed of the generator; the same seed gives the same problems and ids."""
    style: str = "question"
    """Problem phrasing: a name from ``graft.registry.STYLES`` or a format string with ``{a}`` and ``{b}``."""
    families: list[str] | None = None
    """A mixture of problem families (``graft.registry.FAMILIES``: add, story_mul, spelled, ...):
    prompt i comes from ``families[i % len(families)]`` (name a family twice for twice the share), with
    ids ``FAMILY-00017``. ``None``: single-step ``a op b`` problems from ``ops`` and ``style``."""

    def __post_init__(self) -> None:
        check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        check(
            self.families is None or (len(self.families) > 0 and set(self.families) <= set(FAMILIES)),
            "families",
            f"must be a non-empty list of {', '.join(FAMILIES)}; got {self.families}",
        )
        check(self.max_operand >= 0, "max_operand", f"must be >= 0, got {self.max_operand}")
        check(
            set(self.ops) <= {"+", "-", "*"} and len(self.ops) > 0, "ops", f"must be a non-empty subset of + - *, got {self.ops}"
        )
        template = STYLES.get(self.style, self.style)
        try:
            fits = (
                "{a}" in template
                and "{b}" in template
                and bool(template.format(a=1, b=2, op="+", op_word="plus", op_latex="+", op_unicode="+"))
            )
        except (KeyError, IndexError, ValueError):
            fits = False
        check(
            fits,
            "style",
            f"unknown arithmetic style {self.style!r}: use one of {', '.join(STYLES)} or a format "
            "string with {a} and {b} (and optionally {op}, {op_word}, {op_latex}, {op_unicode})",
        )


@dataclass
class CodeTaskConfig:
    num_prompts: int = 512
    """How many distinct function-writing problems the procedural code task generates."""
    seed: int = 1234
    """Seed of the generator; the same seed gives the same problems, tests and ids."""
    families: list[str] | None = None
    """Problem families (graft/data/code_task.py ``CODE_FAMILIES``: add, reverse, list_stat, ...): prompt i comes
    from ``families[i % len(families)]``; ``None``: every family but ``factorial``."""
    tests_per_prompt: int = 4
    """Hidden ``assert f(x) == y`` tests per problem (never the example the problem text shows)."""

    def __post_init__(self) -> None:
        check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        check(self.families is None or len(self.families) > 0, "families", "must name at least one family (or be null)")
        check(self.tests_per_prompt >= 1, "tests_per_prompt", f"must be >= 1, got {self.tests_per_prompt}")


@dataclass
class DataConfig:
    train: str = "arithmetic"
    """Training prompts: ``arithmetic`` (the procedural task), ``code_task`` (the procedural code task), a
    ``.jsonl``/``.parquet``/``.csv``/``.tsv``/``.json`` file, a folder saved by ``datasets`` (``folder[:split]``), or
    ``hub:NAME[:split]`` for a Hugging Face dataset; rows ``{id, problem, answer}`` (or ``tests`` for code), other
    column names mapped by ``fields``."""
    val: str | None = None
    """Validation set for in-training evaluation (same forms as ``train``); ``None`` disables it."""
    val_limit: int | None = None
    """Use only the first ``val_limit`` validation prompts."""
    on_bad_row: Annotated[str, BAD_ROWS] = "error"
    """A malformed row stops the run (``error``) or is skipped and counted (``skip``)."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    """Settings of the procedural arithmetic task."""
    code_task: CodeTaskConfig = field(default_factory=CodeTaskConfig)
    """Settings of the procedural code task (``train: code_task``, with ``reward.domain: code``)."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch (seeded by ``seed`` and the epoch number)."""
    fields: dict[str, str] = field(default_factory=dict)
    """graft's column names -> your file's (``{problem: question, answer: solution, tests: test_list}``); graft's
    names are id, problem, answer, tests, entry_point. Every other column is kept and reaches the reward."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(bool(str(self.train).strip()), "train", "is required (arithmetic, a data file or folder, or hub:NAME)")
        bad = [k for k in self.fields if k not in ("id", "problem", "answer", "tests", "entry_point")]
        check(not bad, "fields", f"{bad[:1]} is not a graft field name; map id, problem, answer, tests, entry_point")
        check(self.val_limit is None or self.val_limit > 0, "val_limit", f"must be positive, got {self.val_limit}")
