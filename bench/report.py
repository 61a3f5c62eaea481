"""Charts of bench/RESULTS.md's current figures, drawn from the tables of that page.

Owns the PNGs of bench/charts/: produce and consume beside the peers, single-send latency
percentiles, the longest write gap per drill scenario, and broker memory against stored messages.
The figures are read from RESULTS.md itself (one place to change them), so a chart cannot
disagree with the table it illustrates. Run from the repository root:

    .venv/bin/python -m bench.report               # writes bench/charts/*.png
    .venv/bin/python -m bench.report --out DIR     # elsewhere

Needs matplotlib (the `dev` extra).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
CHARTS = HERE / "charts"

#: The peers' columns and tidelog's, as the tables name them, in the order the charts draw them.
SYSTEMS = [
    "tidelog `flush: async`",
    "tidelog `flush: sync`",
    "NATS R2",
    "NATS R3",
    "Redis `always`",
    "Redis `everysec`",
]
COLORS = ["#1f5fa8", "#6fa1dc", "#d9822b", "#f0b878", "#b22d2d", "#e58a8a"]

Row = dict[str, str]


def tables(text: str) -> dict[str, list[Row]]:
    """Every `### heading` of the page -> the rows of the first table under it (column -> cell)."""
    out: dict[str, list[Row]] = {}
    heading = None
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("### "):
            heading = line[4:].strip()
        elif line.startswith("|") and heading is not None and heading not in out:
            out[heading] = list(_rows(line, lines))
    return out


def _rows(header: str, lines: Iterator[str]) -> Iterator[Row]:
    columns = _cells(header)
    for line in lines:
        if not line.startswith("|"):
            return
        cells = _cells(line)
        if all(set(c) <= set("-:") for c in cells):
            continue  # the alignment row
        yield dict(zip(columns, cells, strict=True))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell: str) -> float | None:
    """A cell's figure: "70,597" -> 70597, "5×10^7" -> 5e7, "55 MiB" -> 55; "—" -> None."""
    text = cell.replace(",", "").replace("*", "").strip()
    power = re.fullmatch(r"(?:(\d+(?:\.\d+)?)×)?10\^(\d+)", text)
    if power:
        return float(power.group(1) or 1) * 10 ** int(power.group(2))
    match = re.match(r"-?\d+(?:\.\d+)?", text)
    return float(match.group()) if match else None


def span(cell: str) -> tuple[float, float]:
    """A figure or a range: "3.30–3.81" -> (3.30, 3.81), "1.27" -> (1.27, 1.27)."""
    parts = [number(p) for p in cell.split("–")]
    values = [p for p in parts if p is not None]
    if not values:
        raise ValueError(f"no figure in {cell!r}")
    return min(values), max(values)


def section(all_tables: dict[str, list[Row]], prefix: str) -> list[Row]:
    for heading, rows in all_tables.items():
        if heading.startswith(prefix):
            return rows
    raise KeyError(f"no table under a heading starting {prefix!r} in {RESULTS.name}")


def _bars(ax: Any, rows: list[Row], title: str, ylabel: str, *, log: bool = False) -> None:
    from matplotlib.ticker import FuncFormatter

    width = 0.8 / len(SYSTEMS)
    for i, (system, color) in enumerate(zip(SYSTEMS, COLORS, strict=True)):
        xs, ys = [], []
        for j, row in enumerate(rows):
            value = number(row[system])
            if value is not None:
                xs.append(j + (i - (len(SYSTEMS) - 1) / 2) * width)
                ys.append(value)
        ax.bar(xs, ys, width, label=system.replace("`", ""), color=color)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([_label(r) for r in rows])
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    # 70,000 rather than 70000 or 7×10^4: the tables' own way of writing figures
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 10 else f"{v:g}"))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _label(row: Row) -> str:
    first = next(iter(row.values()))
    return first.replace("produce, ", "").replace(", msgs/s", "").replace("`", "")


def _source(row: Row) -> str:
    return f"{row.get('command', '')}, commit {row.get('commit', '')}".replace("`", "")


def throughput(plt: Any, all_tables: dict[str, list[Row]], out: Path) -> Path:
    rows = section(all_tables, "Produce and consume")
    produce = [r for r in rows if r["measurement"].startswith("produce")]
    consume = [r for r in rows if r["measurement"].startswith("consume")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [2, 1]})
    _bars(left, produce, "Produce, messages of 1 KiB", "messages per second")
    _bars(right, consume, "Consume", "messages per second")
    left.legend(fontsize=8)
    fig.suptitle(f"tidelog beside the peers ({_source(rows[0])}; higher is better)")
    return _save(fig, out / "throughput.png")


def latency(plt: Any, all_tables: dict[str, list[Row]], out: Path) -> Path:
    rows = section(all_tables, "Latency of one send")
    fig, ax = plt.subplots(figsize=(11, 5))
    _bars(
        ax,
        rows,
        f"One send at a time ({_source(rows[0])}; lower is better)",
        "milliseconds (log scale)",
        log=True,
    )
    ax.legend(fontsize=8, ncol=3)
    return _save(fig, out / "latency.png")


def failover(plt: Any, all_tables: dict[str, list[Row]], out: Path) -> Path:
    rows = section(all_tables, "Failover gaps per drill scenario")
    spans = [span(r["longest write gap, s"]) for r in rows]
    names = [r["scenario"] for r in rows]
    fig, ax = plt.subplots(figsize=(11, 6))
    ys = range(len(rows))
    ax.barh(ys, [hi for _, hi in spans], color="#6fa1dc", label="longest gap (the worst run)")
    ax.barh(ys, [lo for lo, _ in spans], color="#1f5fa8", label="the best run, where there were several")
    for y, (_, hi) in zip(ys, spans, strict=True):
        ax.text(hi + 0.2, y, f"{hi:g} s", va="center", fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds without an acknowledged write")
    ax.set_title(
        "Longest write gap per drill scenario (the two-datacenter lab unless marked; 0 acknowledged lost in every run)"
    )
    ax.title.set_fontsize(10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_xlim(0, max(hi for _, hi in spans) * 1.1)
    ax.legend(fontsize=8, loc="center right")
    return _save(fig, out / "failover.png")


def memory(plt: Any, all_tables: dict[str, list[Row]], out: Path) -> Path:
    rows = section(all_tables, "Memory and restart time")
    stored = [number(r["stored messages"]) for r in rows]
    fig, (rss, restart) = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, now, before, unit in (
        (rss, "broker RSS", "before: RSS", "MiB"),
        (restart, "restart, s", "before: restart, s", "seconds"),
    ):
        ax.plot(
            stored,
            [span(r[before])[1] for r in rows],
            "o--",
            color="#b22d2d",
            label="before (every unit in memory)",
        )
        ax.plot(
            stored,
            [span(r[now])[1] for r in rows],
            "o-",
            color="#1f5fa8",
            label=f"now (commit {rows[0]['commit']})",
        )
        ax.set_xscale("log")
        ax.set_xlabel("messages stored")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    rss.set_title("Broker memory (RSS)")
    restart.set_title("Restart until it serves (the slowest run)")
    fig.suptitle("Against stored messages (python -m bench.cqmemory)")
    return _save(fig, out / "memory.png")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    # no software or date stamp: the same figures give the same file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    fig.clf()
    return path


def draw(out: Path = CHARTS, results: Path = RESULTS) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    all_tables = tables(results.read_text())
    paths = [chart(plt, all_tables, out) for chart in (throughput, latency, failover, memory)]
    plt.close("all")
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CHARTS, help="where the PNGs go")
    args = ap.parse_args()
    for path in draw(args.out):
        print(path)


if __name__ == "__main__":
    main()
