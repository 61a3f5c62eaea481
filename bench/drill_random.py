"""Random drills on a two-datacenter lab: many seeds, each a schedule of faults, each checked.

Starts `tide cluster up --netns` with deploy/two-dc-lab.yaml (3 controllers in dc-a, dc-b,
dc-c; broker-a with one replica in dc-a and one in dc-b; sync replication, adaptive acks; 1 ms
WAN delay), runs `tide drill random --seed S --steps K` for each seed, and prints one row per
seed and a summary: acknowledged messages lost and replicas that differ must both be 0, with no
split brain. A failing seed is printed with its schedule, to be made a regression test. Needs
root (network namespaces). From the repository root:

    python -m bench.drill_random --seeds 100 --steps 3 [--first 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPOLOGY = Path(__file__).resolve().parents[1] / "deploy" / "two-dc-lab.yaml"


def tide(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tide-drills-"))
    topo = base / "two-dc.yaml"
    topo.write_text(TOPOLOGY.read_text())
    data_dir = base / "cluster"
    rows: list[dict[str, Any]] = []
    up = tide("cluster", "up", "--netns", "-c", str(topo), "--data-dir", str(data_dir))
    if up.returncode != 0:
        sys.exit(f"cluster up failed: {up.stderr.strip()}")
    try:
        for seed in range(args.first, args.first + args.seeds):
            t0 = time.monotonic()
            out = tide(
                "drill",
                "random",
                "--seed",
                str(seed),
                "--steps",
                str(args.steps),
                "--data-dir",
                str(data_dir),
                "--json",
            )
            try:
                rep = json.loads(out.stdout[out.stdout.index("{") :])
            except ValueError:
                rep = {"error": (out.stderr or out.stdout).strip()[-500:]}
            row = {
                "seed": seed,
                "seconds": round(time.monotonic() - t0, 1),
                **{
                    k: rep.get(k)
                    for k in (
                        "acked",
                        "acked_lost",
                        "duplicates",
                        "max_write_gap_s",
                        "split_brain",
                        "replicas_identical",
                        "error",
                    )
                },
                "steps": [s["step"] for s in rep.get("steps", [])],
            }
            rows.append(row)
            if not args.json:
                print(
                    f"seed {seed:3d}: acked {row['acked']} lost {row['acked_lost']} dup "
                    f"{row['duplicates']} "
                    f"gap {row['max_write_gap_s']}s split {row['split_brain']} identical "
                    f"{row['replicas_identical']} ({row['seconds']}s) {row['error'] or ''}",
                    flush=True,
                )
    finally:
        tide("cluster", "down", "--data-dir", str(data_dir))
        shutil.rmtree(base, ignore_errors=True)
    bad = [r for r in rows if r["acked_lost"] != 0 or r["split_brain"] or r["replicas_identical"] is not True]
    summary = {
        "seeds": len(rows),
        "steps": args.steps,
        "acked": sum(r["acked"] or 0 for r in rows),
        "acked_lost": sum(r["acked_lost"] or 0 for r in rows if r["acked_lost"]),
        "seeds_failing": [r["seed"] for r in bad],
        "max_write_gap_s": max((r["max_write_gap_s"] or 0 for r in rows), default=0),
    }
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=2))
    else:
        print(json.dumps(summary))
        for r in bad:
            print(f"FAILING seed {r['seed']}: {r['steps']} {r.get('error') or ''}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
