"""A broker's open-file limit and its consume queues' descriptor bound (broker/fdlimit.py): the
bound is lowered to fit the limit, never below the minimum; the soft limit is raised towards
the hard limit, in a process of its own with a low soft limit (as a login shell's 1,024)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker import fdlimit
from tidelog.commitlog.log import MIN_CQ_OPEN_FILES


@given(st.integers(MIN_CQ_OPEN_FILES, 1 << 20), st.integers(0, 1 << 21))
def test_the_bound_fits_under_the_limit_and_keeps_the_reserve(configured: int, soft: int) -> None:
    bound = fdlimit.cq_bound(configured, soft)
    assert MIN_CQ_OPEN_FILES <= bound <= configured
    assert bound + fdlimit.RESERVE <= soft or bound == MIN_CQ_OPEN_FILES
    if configured + fdlimit.RESERVE <= soft:
        assert bound == configured


def test_a_table_of_limits() -> None:
    assert fdlimit.cq_bound(16384, 1024) == MIN_CQ_OPEN_FILES
    assert fdlimit.cq_bound(16384, 4096) == 3072
    assert fdlimit.cq_bound(16384, 20000) == 16384
    assert fdlimit.cq_bound(64, 1 << 20) == 64


_CHILD = """
import json, resource, sys
from tidelog.broker import fdlimit
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
bound = fdlimit.fit_cq_bound(int(sys.argv[1]))
print(json.dumps({"bound": bound, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


def test_a_broker_raises_its_soft_limit_for_the_bound() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 256 + 64 + fdlimit.RESERVE:
        pytest.skip(f"a hard limit of {hard} leaves nothing to raise")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, "64"], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"bound": 64, "soft": 64 + fdlimit.RESERVE}
    big = subprocess.run(
        [sys.executable, "-c", _CHILD, str(1 << 30)], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(big.stdout.strip().splitlines()[-1])
    limit = hard if hard != resource.RLIM_INFINITY else (1 << 30) + fdlimit.RESERVE
    assert got["soft"] <= limit
    assert got["bound"] == max(MIN_CQ_OPEN_FILES, got["soft"] - fdlimit.RESERVE) < 1 << 30
    assert "lowered" in big.stderr
