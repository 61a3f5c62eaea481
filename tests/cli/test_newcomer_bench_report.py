"""bench/RESULTS.md as a page people read (issue 40): the current figures in tables, drawn as the
charts of bench/charts/ by `python -m bench.report` from those very tables, and the older
journal kept under bench/history/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench import report

from tests.client.conftest import REPO

CHARTED = {
    "Produce and consume": "throughput.png",
    "Latency of one send": "latency.png",
    "Failover gaps per drill scenario": "failover.png",
    "Memory and restart time": "memory.png",
}


def test_every_charted_table_has_figures_a_command_and_a_commit() -> None:
    tables = report.tables(report.RESULTS.read_text())
    for heading in CHARTED:
        rows = report.section(tables, heading)
        assert rows, heading
        for row in rows:
            assert row["command"].startswith("`") and re.fullmatch(
                r"[0-9a-f]{7}(, [0-9a-f]{7})*", row["commit"]
            ), row
    peers = report.section(tables, "Produce and consume")
    assert all(report.number(r["NATS R2"]) for r in peers), "the peers' figures of the same run"
    assert report.span("3.30–3.81") == (3.30, 3.81) and report.number("5×10^7") == 5e7
    assert report.number("—") is None and report.number("**70,597**") == 70597


def test_the_page_links_each_chart_and_the_journal() -> None:
    text = report.RESULTS.read_text()
    for chart in CHARTED.values():
        assert f"](charts/{chart})" in text
        assert (REPO / "bench" / "charts" / chart).read_bytes().startswith(b"\x89PNG"), (
            f"{chart} is committed"
        )
    journals = list((REPO / "bench" / "history").glob("*.md"))
    assert journals and all(j.stat().st_size > 100_000 for j in journals), "the older entries are kept"
    assert len(text.splitlines()) < 250, "the page stays short: new runs go to the journal"


def test_bench_report_draws_every_chart(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.report", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(CHARTED.values())
    for png in tmp_path.iterdir():
        assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000
