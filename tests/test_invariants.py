"""Invariants stay on under `python -O` and stop the process; the checks added to the storage and HA cores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.ha.master import HaMaster
from tidelog.invariants import EXIT_INVARIANT_VIOLATED, InvariantViolation


def test_a_violation_stops_the_process_even_under_python_O() -> None:
    code = (
        "from tidelog.invariants import require, stop_if_violated\n"
        "try:\n    require(1 + 1 == 3, 'arithmetic broke')\n"
        "except Exception as exc:\n    stop_if_violated(exc)\nprint('still running')\n"
    )
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_INVARIANT_VIOLATED
    assert "still running" not in done.stdout
    assert "arithmetic broke" in done.stderr


def test_the_confirm_offset_never_goes_back_nor_passes_the_max(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20)
    placed = log.append([Message("t", 0, b"x" * 100) for _ in range(3)])
    log.confirm_offset = placed[1].phys_offset
    with pytest.raises(InvariantViolation, match="go back"):
        log.confirm_offset = placed[0].phys_offset
    with pytest.raises(InvariantViolation, match="pass the max"):
        log.confirm_offset = log.max_offset + 1
    log.close()


def test_a_master_outside_its_sync_state_set_is_refused(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20)
    with pytest.raises(InvariantViolation, match="not in its SyncStateSet"):
        HaMaster(log, broker_set="bs", broker_id=1, epoch=1, sync_state_set=frozenset({2}), sss_epoch=1)
    log.close()
