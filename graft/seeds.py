"""Every random stream of graft, derived in one place from the run's ``seed``.

A stream's seed is a function of (seed, what it is for) only, so resuming replays it, a model
samples the same whether it trains alone or in a pair, and a sample does not depend on the batch
size or on how prompts are split over workers.
"""

from __future__ import annotations

import hashlib
import zlib

_MASK63 = (1 << 63) - 1


def step_seed(seed: int, step: int, stream: str) -> int:
    """Seed of one stream at ``step``: a model's sampling (stream = model name), the exchange's
    ablation draws (``exchange``), minibatch planning (``plan/NAME``), evaluation (``eval/NAME``)."""
    return (seed * 1_000_003 + step * 1009 + zlib.crc32(stream.encode())) % (2**63 - 1)


def round_seed(seed: int, step: int, sampling_round: int, stream: str) -> int:
    """Seed of one stream at sampling round ``sampling_round`` of ``step`` (``rollout.dynamic_sampling`` samples
    fresh prompts in rounds after the first): round 0 is :func:`step_seed`'s, so a step of one round samples as
    before, and round r > 0 is the stream ``STREAM/round{r}``."""
    return step_seed(seed, step, stream if sampling_round == 0 else f"{stream}/round{sampling_round}")


def _mix(*xs: int) -> int:
    """SplitMix64-style hash of integers -> a 63-bit seed (decorrelates neighbouring indices)."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (int(x) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & _MASK63


def prompt_seeds(seed: int, offset: int, count: int) -> list[int]:
    """Seeds of prompts ``offset .. offset+count-1`` of a batch sampled with ``seed``: a function of
    (seed, global prompt index) only, so every split of the batch over workers agrees."""
    return [_mix(seed, offset + i) for i in range(count)]


def sample_seed(prompt_seed: int, j: int) -> int:
    """Seed of sample ``j`` of a prompt whose seed is ``prompt_seed``."""
    return _mix(prompt_seed, j, 0x5EED)


def derive_seed(seed: int, repeat: int, key: int | str) -> int:
    """A stable 31-bit evaluation seed from (seed, repeat, key); key = a prompt id (per-prompt seeds)
    or the index of a chunk's first prompt (samplers that take one seed per call)."""
    h = hashlib.sha256(f"graft-eval:{seed}:{repeat}:{key}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def init_seed(seed: int, name: str) -> int:
    """torch seed set right before model ``name`` is built (random parts such as a new LoRA adapter):
    a function of (seed, name), so every backend and every rank initialises identically."""
    return (int(seed) * 1_000_003 + zlib.crc32(f"init/{name}".encode())) % (2**63 - 1)
