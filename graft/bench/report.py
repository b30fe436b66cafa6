"""``bench.md``: the medians of ``graft bench``'s result as markdown tables, one section per part,
and the peak-RSS table (d)."""

from __future__ import annotations

from graft.bench.common import PARTS, fmt

A_ROWS = (
    ("step_s", "step"),
    ("rollout_s", "rollout"),
    ("score_s", "score"),
    ("update_s", "update"),
    ("tokens_generated", "tokens generated"),
    ("rollout_tokens_per_s", "rollout tokens/s"),
    ("rollout_gflops", "rollout GFLOP/s"),
    ("update_gflops", "update GFLOP/s"),
    ("step_gflops", "step GFLOP/s"),
    ("peak_rss_gb", "peak RSS (GiB)"),
)
C_ROWS = (
    ("step_s", "step s"),
    ("rollout_s", "rollout s"),
    ("score_s", "score s"),
    ("exchange_s", "exchange s"),
    ("update_s", "update s"),
    ("transferred", "responses transferred"),
    ("admitted", "responses admitted"),
    ("rollout_gflops", "rollout GFLOP/s"),
    ("update_gflops", "update GFLOP/s"),
    ("step_gflops", "step GFLOP/s"),
    ("peak_rss_gb", "peak RSS (GiB)"),
)
GFLOPS_NOTE = (
    "GFLOP/s: model FLOPs of the phase (`graft/bench/flops.py`: 2 x decoder parameters per position, 2 x H x V "
    "per position with a head, x3 in the update for the backward; attention products left out) over its "
    "seconds; graft's side only."
)


def _median(part: dict, side: str, key: str):
    """The median of ``key`` on ``side`` of a part, None where missing."""
    return ((part.get(side) or {}).get(key) or {}).get("median")


def _ratio(a, b):
    """``a / b`` for numbers, None otherwise or when ``b`` is 0."""
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _header(result: dict) -> list[str]:
    """Title and the machine and settings line."""
    env, s = result["environment"], result["settings"]
    return [
        "# graft bench",
        "",
        f"{env['cpu_model']}{' (' + env['cpu_features'] + ')' if 'cpu_features' in env else ''} "
        f"({env['cpu_count']} CPUs), torch {env['torch']} ({env['torch_threads']} threads), "
        f"transformers {env['transformers']}, TRL {env['trl'] or 'not installed'}; {s['reps']} repetitions, "
        f"alternating; {s['prompts']} prompts x {s['n']} samples, {s['max_new_tokens']} new tokens"
        + (f", temperature {s['temperature']}" if "temperature" in s else "")
        + ". "
        "Medians; every raw value is in bench.json." + _peak_line(env),
        "",
    ]


def _peak_line(env: dict) -> str:
    """The host's measured fp32 matmul rate, the limit the GFLOP/s rows are compared with."""
    peak = env.get("matmul_peak_gflops")
    return (
        ""
        if peak is None
        else (
            f" fp32 matmul peak on this host ({env['torch_threads']} threads, "
            f"[1024, 1024] @ [1024, 1024], best of ~2 s): {peak:.1f} GFLOP/s."
        )
    )


def _of_peak(result: dict, gflops) -> str:
    """``gflops`` as a share of the measured matmul peak ("" when either is missing)."""
    share = _ratio(gflops, result["environment"].get("matmul_peak_gflops"))
    return "" if share is None else f"{100 * share:.0f} % of the measured matmul peak"


def _section_a(a: dict) -> list[str]:
    """(a): graft's step against TRL's, the matched settings and the differences."""
    trl_ok = "skipped" not in a["trl"]
    lines = [f"## (a) GRPO step: graft vs TRL GRPOTrainer — `{a['model']}`", ""]
    if not trl_ok:
        lines += [f"TRL side: {a['trl']['skipped']}", ""]
    lines += ["| median (seconds unless said) | graft | TRL | TRL / graft |", "|---|---|---|---|"]
    for key, label in A_ROWS:
        g, t = _median(a, "graft", key), _median(a, "trl", key)
        digits = 0 if key == "tokens_generated" else 2
        lines.append(f"| {label} | {fmt(g, digits=digits)} | {fmt(t, digits=digits)} | {fmt(_ratio(t, g), 'x', 2)} |")
    if trl_ok:
        lines += [
            "",
            f"TRL `train()` call incl. its set-up: {fmt(_median(a, 'trl', 'train_call_s'), ' s', 2)}; "
            f"prompt token ids identical: {a.get('prompt_ids_match')}; graft forwarded "
            f"{fmt(_median(a, 'graft', 'tokens_update'), digits=0)} tokens in its update.",
        ]
    lines += ["", "Matched TRL settings:", ""] + [f"- {x}" for x in a["matched"]]
    return lines + ["", "Differences that remain:", ""] + [f"- {x}" for x in a["differences"]] + [""]


def _bf16_line(path: str, m: dict) -> str:
    """(b)'s bf16 table row of one model."""
    q = lambda key: _median(m, "graft_bf16", key)  # noqa: E731
    return (
        f"| `{path}` | {fmt(q('seconds'), digits=2)} | {fmt(q('tokens_per_s'))} | "
        f"{fmt(q('recompute_s'), digits=2)} | {fmt(q('tokens_per_s_with_recompute'))} | "
        f"{fmt(_ratio(q('tokens_per_s_with_recompute'), _median(m, 'graft', 'tokens_per_s')), 'x', 2)} | "
        f"{fmt(q('logprob_gap_mean'), digits=4)} / {fmt(q('logprob_gap_max'), digits=3)} |"
    )


def _section_b(b: dict) -> list[str]:
    """(b): graft's sampler against ``model.generate``, then the bf16 sampler with its recompute."""
    lines = [
        "## (b) rollout: graft's sampler vs `model.generate`",
        "",
        "| model | graft s | graft tok/s | generate s | generate tok/s | graft speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for path, m in b.items():
        gs, gt = _median(m, "graft", "seconds"), _median(m, "graft", "tokens_per_s")
        hs, ht = _median(m, "generate", "seconds"), _median(m, "generate", "tokens_per_s")
        lines.append(
            f"| `{path}` | {fmt(gs, digits=2)} | {fmt(gt)} | {fmt(hs, digits=2)} | {fmt(ht)} | {fmt(_ratio(hs, gs), 'x', 2)} |"
        )
    lines += [
        "",
        "graft's sampler over a bf16 copy of the weights (`rollout.engine=hf-bf16`), then the fp32 forward "
        "that recomputes the behaviour log-probs (`update.recompute_old_logprobs=true`, which that engine requires):",
        "",
        "| model | bf16 s | bf16 tok/s | recompute s | bf16 + recompute tok/s | vs graft fp32 | log-prob gap mean / max (nats) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_bf16_line(path, m) for path, m in b.items() if "graft_bf16" in m]
    return lines + [""]


def _section_c(c: dict, reps: int) -> list[str]:
    """(c): the GRAFT step against the GRPO step and the exchange's share."""
    lines = [
        f"## (c) GRAFT step vs GRPO step on the pair ({', '.join(f'`{m}`' for m in c['models'])})",
        "",
        f"Exchange ensured by: {c['exchange_ensured_by']}; repetitions with an exchange: "
        f"{c['repetitions_with_exchange']} of {reps}.",
        "",
        "| | GRAFT | GRPO | GRAFT - GRPO |",
        "|---|---|---|---|",
    ]
    for key, label in C_ROWS:
        g, r = _median(c, "graft", key), _median(c, "grpo", key)
        diff = g - r if isinstance(g, (int, float)) and isinstance(r, (int, float)) else None
        lines.append(f"| {label} | {fmt(g, digits=2)} | {fmt(r, digits=2)} | {fmt(diff, digits=2)} |")
    share = c["exchange_share_when_exchanged"]["median"]
    return lines + [
        "",
        f"Exchange share of the GRAFT step (`time/exchange_s / time/step_s`, steps with an exchange): "
        f"{fmt(None if share is None else 100 * share, ' %')}",
        "",
    ]


def _section_d(result: dict) -> list[str]:
    """(d): the peak RSS of every part and side."""
    lines = [
        "## (d) peak RSS of the bench process (GiB, per repetition side; max over repetitions)",
        "",
        "| part | side | peak RSS |",
        "|---|---|---|",
    ]
    return lines + [f"| {part} | {side} | {fmt(peak, digits=2)} |" for part, side, peak in peak_rows(result)]


def _rate_lines(result: dict, part: str, side: str, what: str) -> list[str]:
    """The whole step's model GFLOP/s against the host's matmul peak, and how the rates are counted."""
    step = _median(result[part], side, "step_gflops")
    if step is None:
        return []
    share = _of_peak(result, step)
    return [f"Achieved over {what}: {step:.1f} GFLOP/s" + (f", {share}." if share else "."), "", GFLOPS_NOTE, ""]


def markdown(result: dict) -> str:
    """``bench.md`` of a (JSON-clean) bench result."""
    lines = _header(result)
    if result.get("a"):
        lines += _section_a(result["a"]) + _rate_lines(result, "a", "graft", "graft's GRPO step")
    if result.get("b"):
        lines += _section_b(result["b"])
    if result.get("c"):
        lines += _section_c(result["c"], result["settings"]["reps"]) + _rate_lines(result, "c", "graft", "the GRAFT step")
    return "\n".join(lines + _section_d(result)) + "\n"


def peak_rows(result: dict) -> list[tuple[str, str, float]]:
    """``(part, side, peak RSS GiB)`` of every side that ran: the maximum over its repetitions."""
    out = []
    for part in PARTS:
        blocks = {"": result[part]} if part in ("a", "c") and part in result else result.get(part, {})
        for label, block in blocks.items():
            for side in ("graft", "graft_bf16", "trl", "generate", "grpo"):
                raw = (block.get(side) or {}).get("raw")
                if raw:
                    out.append((f"{part} {label}".strip(), side, max(r["peak_rss_gb"] for r in raw)))
    return out
