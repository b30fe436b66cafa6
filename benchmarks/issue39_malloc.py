"""Issue 39: ``cpu_memory: keep`` against ``release`` — the rollout and the update at equal work, with page faults.

    python benchmarks/issue39_malloc.py [--config FILE] [--reps 1] [--updates 3] [--out FILE.json] [key=value ...]

``mallopt`` is process-wide and permanent, so each setting runs in its own process, alternating (release, keep,
release, keep, ...). A process: one Run of the config (``threads=2``, ``cpu_memory`` set; overrides after the flags)
samples, scores and exchanges step 1, then times one more rollout of the same prompts and ``--updates`` updates of
every model on step 1's groups (``loop.update_model``, weights and optimiser restored before each), with the system
time and minor page faults of each (``getrusage``). Prints medians per setting: the first update (which grows the
heap) apart from the later ones.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("release", "keep")


def _usage() -> tuple[int, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime


def _timed(fn) -> dict:
    (f0, s0), t0 = _usage(), time.perf_counter()
    fn()
    (f1, s1), t1 = _usage(), time.perf_counter()
    return {"seconds": t1 - t0, "sys_s": s1 - s0, "minor_faults": f1 - f0}


def child(config: str, mode: str, updates: int, overrides: list[str]) -> dict:
    """One process's measurements under ``cpu_memory=mode``."""
    import torch

    from graft.bench.runs import close_run, first_step, restore_model, snapshot_models
    from graft.config import load_config
    from graft.trainer import loop

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        fixed = ["threads=2", "progress=false", f"run_dir={tmp}/run", f"cpu_memory={mode}"]
        cfg = load_config(config, [*fixed, *overrides])
        run = loop.setup(cfg)
        try:
            prompts, train = first_step(run)
            out: dict = {"rollout": _timed(lambda: loop.rollout_phase(run, prompts, 1))}
            start = snapshot_models(run)
            for name in run.learners:
                rows = []
                for _ in range(updates):
                    restore_model(run, name, start)
                    got: dict = {}
                    rows.append(_timed(lambda n=name, g=got: g.update(loop.update_model(run, n, train[n], 1))))
                    rows[-1] |= {"loss": got["loss"], "tokens": got["tokens/update"]}
                out[name] = rows
            out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        finally:
            close_run(run)
    return out


def main() -> int:
    from graft.bench.common import cpu_model
    from graft.bench.runs import default_config_path, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(default_config_path()))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.config, args.child, args.updates, args.overrides)))
        return 0
    raw: dict = {m: [] for m in MODES}
    for rep in range(args.reps):
        for mode in MODES:
            cmd = [sys.executable, __file__, "--config", args.config, "--updates", str(args.updates), "--child", mode]
            p = subprocess.run([*cmd, *args.overrides], capture_output=True, text=True, check=True)
            raw[mode].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"rep {rep + 1} {mode}: {raw[mode][-1]}", file=sys.stderr, flush=True)
    _report(raw, args)
    write_results(args.out, raw, args, cpu=cpu_model())
    return 0


def _report(raw: dict, args) -> None:
    from graft.bench.common import cpu_model

    med = statistics.median
    print(f"{cpu_model()}, 2 threads, {args.reps} process(es) per setting, {args.updates} updates each; {args.overrides}")
    print("| phase | release: s (sys s, minor faults) | keep: s (sys s, minor faults) | speed-up |")
    print("|---|---:|---:|---:|")
    phases = [("rollout (both models)", lambda r: [r["rollout"]])]
    for name in (k for k in raw["keep"][0] if k not in ("rollout", "peak_rss_gb")):
        phases.append((f"{name} update, first", lambda r, n=name: r[n][:1]))
        phases.append((f"{name} update, later", lambda r, n=name: r[n][1:]))
    for label, pick in phases:
        cells = []
        for mode in MODES:
            rows = [x for r in raw[mode] for x in pick(r)]
            if not rows:
                cells.append(None)
                continue
            cells.append((med(x["seconds"] for x in rows), med(x["sys_s"] for x in rows), med(x["minor_faults"] for x in rows)))
        if None in cells:
            continue
        (a, sa, fa), (b, sb, fb) = cells
        print(f"| {label} | {a:.2f} ({sa:.1f}, {fa:,.0f}) | {b:.2f} ({sb:.1f}, {fb:,.0f}) | {a / b:.2f}x |")
    rss = {m: max(r["peak_rss_gb"] for r in raw[m]) for m in MODES}
    print(f"peak RSS: release {rss['release']:.2f} GB, keep {rss['keep']:.2f} GB")


if __name__ == "__main__":
    sys.exit(main())
