"""`make fuzz`: every fuzzer of tests/fuzz with a large number of inputs, and a line per fuzzer
with the inputs run, the time taken and the failures.

Why not pytest: pytest reports a pass or a fail, not how many inputs ran; and Hypothesis draws
each input through its strategies (and keeps shrinking state), which costs milliseconds per
input, so a million inputs per fuzzer would take days. Here Hypothesis only generates the seeds
(a few hundred valid-looking inputs per fuzzer, the same strategies the tests use); the volume
comes from a plain mutation loop over them (tests/fuzz/fuzzing.py `mutate`: bit flips, edge
values over length fields, inserts, cuts, repeats, stacked on earlier mutations), and every
input goes through the same contract check the pytest run uses. A failing input is printed in
full (hex) with its traceback, to be kept as a regression test (tests/fuzz/test_regressions.py).

    python -m tests.fuzz.run [--examples N] [--only SUBSTRING] [--seeds N] [--seed N]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import random
import sys
import time
import traceback
from dataclasses import dataclass, field

from hypothesis import Phase, given, settings

from tests import fuzz
from tests.fuzz.fuzzing import Check, Fuzzer, mutate

#: Failing inputs printed per fuzzer (the rest are counted).
SHOWN_FAILURES = 3
#: Largest input printed in full.
SHOWN_BYTES = 8192


@dataclass
class Outcome:
    name: str
    inputs: int = 0
    seconds: float = 0.0
    failures: int = 0
    shown: list[str] = field(default_factory=list)


def fuzzers(only: str | None) -> list[Fuzzer]:
    """Every module's FUZZERS, in module order."""
    out: list[Fuzzer] = []
    for info in sorted(pkgutil.iter_modules(fuzz.__path__), key=lambda m: m.name):
        if info.name.startswith("test_"):
            module = importlib.import_module(f"tests.fuzz.{info.name}")
            out += getattr(module, "FUZZERS", [])
    return [f for f in out if only is None or only in f.name]


def seeds_of(fz: Fuzzer, count: int, seed: int) -> list[bytes]:
    """`count` inputs drawn from the fuzzer's seed strategy (generation only: nothing to shrink)."""
    drawn: list[bytes] = []

    @settings(max_examples=count, phases=[Phase.generate], database=None, deadline=None)
    @given(fz.seeds)
    def collect(data: bytes) -> None:
        drawn.append(data)

    collect._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    collect()
    return drawn


def _next_input(rng: random.Random, pool: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.05:
        return rng.randbytes(rng.randrange(96))
    if r < 0.15:
        return rng.choice(pool)
    return mutate(rng.choice(pool), rng)


def _failed(out: Outcome, data: bytes) -> None:
    out.failures += 1
    if len(out.shown) < SHOWN_FAILURES:
        shown = data.hex() if len(data) <= SHOWN_BYTES else data[:SHOWN_BYTES].hex() + "..."
        out.shown.append(f"input ({len(data)} bytes): {shown}\n{traceback.format_exc()}")


def run_one(fz: Fuzzer, examples: int, seeds: int, seed: int) -> Outcome:
    out = Outcome(fz.name)
    rng = random.Random(seed)
    pool = seeds_of(fz, seeds, seed) or [b""]
    kept = len(pool)
    started = time.monotonic()
    with fz.open() as check:
        for _ in range(examples):
            data = _next_input(rng, pool)
            out.inputs += 1
            if not _passes(check, data, out):
                continue
            # keep a few survivors, so that edits stack up over the run (deeper than 4 edits)
            if rng.random() < 0.02:
                if len(pool) < 2 * kept:
                    pool.append(data)
                else:
                    pool[rng.randrange(kept, len(pool))] = data
    out.seconds = time.monotonic() - started
    return out


def _passes(check: Check, data: bytes, out: Outcome) -> bool:
    try:
        check(data)
    except Exception:
        _failed(out, data)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=1_000_000, help="inputs per fuzzer")
    parser.add_argument("--only", help="run the fuzzers whose name contains this")
    parser.add_argument("--seeds", type=int, default=300, help="Hypothesis-generated seeds per fuzzer")
    parser.add_argument("--seed", type=int, default=0, help="random seed (the same seed repeats a run)")
    args = parser.parse_args(argv)
    # Torn tails and refused connections are logged as warnings: a million of them would bury the
    # table. A failure is an exception out of a check, which the table counts and prints.
    logging.disable(logging.CRITICAL)
    total = 0
    print(f"{'fuzzer':<24} {'inputs':>10} {'seconds':>9} {'inputs/s':>9} {'failures':>9}", flush=True)
    for fz in fuzzers(args.only):
        out = run_one(fz, args.examples, args.seeds, args.seed)
        rate = out.inputs / out.seconds if out.seconds else 0.0
        print(
            f"{out.name:<24} {out.inputs:>10} {out.seconds:>9.1f} {rate:>9.0f} {out.failures:>9}", flush=True
        )
        for shown in out.shown:
            print(shown, file=sys.stderr)
        total += out.failures
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
