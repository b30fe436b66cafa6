"""Re-derive every exchange.pairing decision of a run from its audit.jsonl alone, and print what each receiver
chose and admitted per step.

    python results/pairing/rederive.py RUN_DIR [RUN_DIR ...]

For every record S -> R of step t: the window score from the evidence of the records S -> R of steps
t - window + 1 .. t (complementary: the sum of ``solved``; compatible: the median, interpolated, of every ``s``),
then R's choice: the highest score, ties to the earlier model of the run's config. A run of pairing ``all`` has no
``pairing`` field: every peer is chosen. Exits 1 on any mismatch.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch
import yaml


def score(rule: str, evidence: list[dict]) -> float | None:
    if rule == "complementary":
        return float(sum(e["solved"] for e in evidence))
    values = [x for e in evidence for x in e["s"]]
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), 0.5)) if values else None


def rederive(run: Path) -> int:
    names = [m["name"] for m in yaml.safe_load((run / "config.yaml").read_text())["models"]]
    audit = [json.loads(x) for x in (run / "audit.jsonl").read_text().splitlines()]
    by = defaultdict(dict)
    for a in audit:
        by[a["step"], a["receiver"]][a["source"]] = a
    bad = 0
    print(f"{run}:")
    for (t, r), recs in sorted(by.items(), key=lambda kv: (kv[0][0], names.index(kv[0][1]))):
        srcs = [s for s in names if s in recs]
        p = recs[srcs[0]].get("pairing")
        if p is None:
            chosen, scores = srcs, {s: None for s in srcs}
        else:
            scores = {s: score(p["rule"], [a["pairing"]["evidence"] for a in audit
                                           if (a["source"], a["receiver"]) == (s, r)
                                           and t - p["window"] < a["step"] <= t]) for s in srcs}
            top = max(srcs, key=lambda s: (-math.inf if scores[s] is None else scores[s], -names.index(s)))
            chosen = [top]
            for s in srcs:
                rec = recs[s]["pairing"]
                same = (rec["score"] is None and scores[s] is None) or (
                    rec["score"] is not None and scores[s] is not None and math.isclose(rec["score"], scores[s]))
                if not same or rec["chosen"] != chosen:
                    bad += 1
                    print(f"  MISMATCH step {t} {s}->{r}: logged {rec['score']} {rec['chosen']}, "
                          f"re-derived {scores[s]} {chosen}")
        admitted = {s: sum(x["admitted"] for x in recs[s]["responses"]) for s in srcs}
        shown = ", ".join(f"{s} {'-' if scores[s] is None else round(scores[s], 3)} (admitted {admitted[s]})" for s in srcs)
        print(f"  step {t} {r} <- {'+'.join(chosen)}   [{shown}]")
    print(f"  {len(by)} decisions re-derived from the log, {bad} mismatches")
    return bad


if __name__ == "__main__":
    sys.exit(1 if sum(rederive(Path(a)) for a in sys.argv[1:]) else 0)
