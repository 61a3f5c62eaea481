"""What the fuzzers of tests/fuzz share: the example budget, the mutation operators, and the
`Fuzzer` record each module lists so that `tests/fuzz/run.py` (`make fuzz`) can drive it.

Every fuzzer is a contract check over bytes: `check(data)` returns when the code under test
answered `data` with a valid value or with its documented typed error, and raises (an
AssertionError, or the stray exception itself) when it did anything else. Under pytest each
module runs its checks through Hypothesis (`@given`, derandomized, `EXAMPLES` inputs each); the
runner calls the same checks on mutations of Hypothesis-generated seeds, which is how a million
inputs per fuzzer fit in hours instead of days (see run.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Inputs per fuzzer under pytest; `TIDELOG_FUZZ_EXAMPLES` raises it (the runner has its own count).
EXAMPLES = int(os.environ.get("TIDELOG_FUZZ_EXAMPLES", "300"))

#: The settings of every fuzz test: derandomized, so that CI sees the same inputs on every run
#: (a new failure is a change in the code, not luck), no deadline (the machine is shared), no
#: example database (a fuzzer's finds become explicit regression inputs instead).
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

Check = Callable[[bytes], None]


@dataclass(frozen=True)
class Fuzzer:
    """One target: valid-looking inputs to start from, and how to get its contract check (a
    context manager, so that a check needing a log or a server has one for a whole run)."""

    name: str
    seeds: st.SearchStrategy[bytes]
    open: Callable[[], contextlib.AbstractContextManager[Check]]


def plain(check: Check) -> Callable[[], contextlib.AbstractContextManager[Check]]:
    """`Fuzzer.open` for a check that needs nothing set up."""

    @contextlib.contextmanager
    def opened() -> Iterator[Check]:
        yield check

    return opened


# Values that sit on the edges of length and count fields: zero, one, the signed and unsigned
# maxima of each width, and just past them.
_EDGES = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF)
_INT = {2: struct.Struct(">H"), 4: struct.Struct(">I"), 8: struct.Struct(">Q")}


def _put_int(out: bytearray, rng: random.Random) -> None:
    width = rng.choice((2, 4, 4, 8))
    if len(out) < width:
        return
    at = rng.randrange(len(out) - width + 1)
    value = rng.choice((*_EDGES, len(out), len(out) - at, rng.getrandbits(width * 8)))
    if width == 8 and rng.random() < 0.3:
        value = rng.choice((2**63 - 1, 2**63, 2**64 - 1))
    _INT[width].pack_into(out, at, value & ((1 << (width * 8)) - 1))


def _mutate_once(out: bytearray, rng: random.Random) -> None:
    op = rng.randrange(8)
    n = len(out)
    if op == 0 and n:  # flip one bit
        out[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif op == 1 and n:  # set one byte
        out[rng.randrange(n)] = rng.randrange(256)
    elif op == 2:  # an edge value over a length or count field
        _put_int(out, rng)
    elif op == 3:  # insert a few bytes
        at = rng.randrange(n + 1)
        out[at:at] = rng.randbytes(rng.randrange(1, 17))
    elif op == 4 and n:  # delete a range
        at = rng.randrange(n)
        del out[at : at + rng.randrange(1, 33)]
    elif op == 5 and n:  # cut the tail off
        del out[rng.randrange(n) :]
    elif op == 6 and n:  # repeat a slice somewhere else (frames and records back to back)
        at = rng.randrange(n)
        piece = out[at : at + rng.randrange(1, 65)]
        to = rng.randrange(n + 1)
        out[to:to] = piece
    else:  # random bytes at the end
        out += rng.randbytes(rng.randrange(1, 33))


def mutate(data: bytes, rng: random.Random) -> bytes:
    """`data` after one to four random edits (bit flips, edge values, inserts, cuts, repeats)."""
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        _mutate_once(out, rng)
    return bytes(out)


# Built once here, at import: the first use of `st.randoms` imports a module of Hypothesis's that
# pytest rewrites, and when that happened deep inside the validation of a nested strategy,
# CPython 3.11's parser failed with "AST constructor recursion depth mismatch" (a SystemError of
# the parser, not of the code under test).
_RANDOMS = st.randoms(use_true_random=False)
_RANDOMS.validate()


def inputs(seeds: st.SearchStrategy[bytes], max_random: int = 512) -> st.SearchStrategy[bytes]:
    """What a fuzz test draws: a valid-looking seed, a mutation of one, or plain random bytes."""
    return st.one_of(
        seeds,
        st.builds(mutate, seeds, _RANDOMS),
        st.binary(max_size=max_random),
    )
