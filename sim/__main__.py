"""`python -m tidelog.sim`: run a batch of seeds, replay one with its trace, or run the mutants.

    python -m tidelog.sim --seeds N --start S [--faults K]   a batch; the last line is one JSON object
    python -m tidelog.sim --seed S --trace                    replay one seed bit for bit, with its trace
    python -m tidelog.sim --mutants [--seeds N]               each mutant until a seed catches it

A failing seed prints the command that replays it, the shrunk fault schedule and the events
around the violation. Exit status 1 when a seed fails (or, with --mutants, when one survives).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from .run import SEED_CPU_S, OverCpuTime, batch, cpu_cap, shrink
from .world import DEFAULT_FAULTS, run_seed


def _replay(seed: int, n_faults: int, trace: bool) -> int:
    try:
        with cpu_cap(SEED_CPU_S):
            out = run_seed(seed, n_faults=n_faults, trace=trace)
    except OverCpuTime:
        print(f"seed {seed}: more than {SEED_CPU_S} s of CPU time; where it was:")
        traceback.print_exc(file=sys.stdout)  # the event that never returned
        return 1
    print(
        f"seed {seed}: {len(out.faults)} faults, {out.sim_ms / 1000:.1f} simulated s, {out.acks} writes acknowledged"
    )
    for f in out.faults:
        print(f"  fault {f}")
    if trace:
        print("\n".join(out.trace))
    if out.ok:
        print("ok")
        return 0
    print(f"VIOLATION at {out.at_ms / 1000:.3f}s: {out.violation}")
    small, shrunk = shrink(seed, out.faults, n_faults)
    print(f"shrunk to {len(small)} of {len(out.faults)} faults (still failing: {shrunk.violation}):")
    for f in small:
        print(f"  fault {f}")
    if not trace:
        print("the events before the violation:")
        print("\n".join(out.trace[-60:]))
    return 1


def _batch(start: int, n: int, n_faults: int, workers: int | None) -> int:
    summary = batch(
        start,
        n,
        n_faults=n_faults,
        workers=workers,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    failures = summary.pop("_failures")
    for seed, why in failures[:20]:
        print(f"seed {seed} failed: {why}")
        print(f"  replay: python -m tidelog.sim --seed {seed} --faults {n_faults} --trace")
    print(json.dumps(summary))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tidelog.sim", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=None, help="how many seeds")
    p.add_argument("--start", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, default=None, help="replay this one seed")
    p.add_argument("--faults", type=int, default=DEFAULT_FAULTS, help="faults per seed")
    p.add_argument("--trace", action="store_true", help="print every traced event of the seed")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: 2)")
    p.add_argument("--mutants", action="store_true", help="run every mutant; seeds-to-catch each")
    a = p.parse_args(argv)
    if a.mutants:
        from .mutants import run_all

        return run_all(a.seeds or 10_000, a.start, a.faults, a.workers)
    if a.seed is not None:
        return _replay(a.seed, a.faults, a.trace)
    return _batch(a.start, a.seeds or 100, a.faults, a.workers)


if __name__ == "__main__":
    sys.exit(main())
