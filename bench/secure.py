"""The cost of security: the same produce workloads on a plain cluster, with TLS, and with TLS and
signed, permitted calls (users and grants).

Each variant starts its own cluster with `tide cluster up` (one controller, a broker set of two
replicas on loopback, `replication: sync`, `flush: async`, as deploy/local.yaml):

- `plain`: deploy/local.yaml;
- `tls`: deploy/secure.yaml without its `auth:` section (TLS on every port);
- `tls+auth`: deploy/secure.yaml (TLS, and every call signed by a user and checked against the
  grants). The bench's calls are made as a user created for it with `produce` on the bench's
  topic only, so each call's rule is looked up as a real application's would be (the admin's
  cluster-wide permission would pass on its first rule).

Workloads (1 KiB bodies, a topic of 8 queues, one client process with tidelog's AsyncClient):

- batches of 1,000 (`send_batch`, one in flight, closed loop) for `--seconds`;
- `send()` with 1,000 in flight (the producer batches them) for `--seconds`;
- single sends one at a time, `--singles` of them: p50 and p99 of each send's time.

Run from the repository root (the variants run one after another; nothing else should run):

    python -m bench.secure                 # table
    python -m bench.secure --seconds 3 --singles 300 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.commitlog import code_version
from bench.produce import percentile
from tidelog.client.aio import AsyncClient, OutMessage

REPO = Path(__file__).resolve().parents[1]
BODY = b"x" * 1024
TOPIC = "bench-secure"
QUEUES = 8
USER = "bencher"
VARIANTS = ("plain", "tls", "tls+auth")


def _tide(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if out.returncode != 0:
        raise RuntimeError(f"tide {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def _topology(variant: str, work: Path) -> Path:
    if variant == "plain":
        return REPO / "deploy" / "local.yaml"
    doc = yaml.safe_load((REPO / "deploy" / "secure.yaml").read_text())
    if variant == "tls":
        doc.pop("auth", None)
    path = work / f"{variant.replace('+', '-')}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _client_env(doc: dict[str, Any]) -> dict[str, str]:
    env = {"TIDE_CONTROLLERS": doc["controllers"]}
    if doc.get("ca_file"):
        env["TIDE_CA_FILE"] = doc["ca_file"]
    if doc.get("credentials"):
        env["TIDE_ACCESS_KEY"] = doc["credentials"]["access_key"]
        env["TIDE_SECRET_KEY"] = doc["credentials"]["secret_key"]
    return env


async def _batches(producer: Any, seconds: float) -> float:
    batch = [OutMessage(BODY) for _ in range(1000)]
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await producer.send_batch(TOPIC, batch)
        sent += len(batch)
    return sent / (time.perf_counter() - t0)


async def _in_flight(producer: Any, seconds: float, window: int = 1000) -> float:
    sent, t0 = 0, time.perf_counter()
    pending: set[asyncio.Future[Any]] = set()
    while time.perf_counter() - t0 < seconds:
        while len(pending) < window:
            pending.add(producer.send(TOPIC, BODY))
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for f in done:
            f.result()
        sent += len(done)
    await asyncio.gather(*pending)
    return (sent + len(pending)) / (time.perf_counter() - t0)


async def _singles(producer: Any, count: int) -> dict[str, float]:
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        await producer.send(TOPIC, BODY)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99), "max_ms": times[-1]}


async def _workloads(env: dict[str, str], seconds: float, singles: int) -> dict[str, Any]:
    client = AsyncClient(
        env["TIDE_CONTROLLERS"],
        ca_file=env.get("TIDE_CA_FILE"),
        access_key=env.get("TIDE_ACCESS_KEY"),
        secret_key=env.get("TIDE_SECRET_KEY"),
    )
    async with client:
        producer = client.producer()
        await producer.send(TOPIC, BODY)  # route, channels and data connection made before timing
        return {
            "batch_1000_msgs_per_s": round(await _batches(producer, seconds)),
            "in_flight_1000_msgs_per_s": round(await _in_flight(producer, seconds)),
            "single_sends": await _singles(producer, singles),
        }


def run_variant(variant: str, work: Path, seconds: float, singles: int) -> dict[str, Any]:
    data_dir = work / variant.replace("+", "-")
    doc = json.loads(
        _tide("cluster", "up", "-c", str(_topology(variant, work)), "--data-dir", str(data_dir), "--json")
    )
    try:
        admin = _client_env(doc)
        _tide("topic", "create", TOPIC, "--queues", str(QUEUES), env=admin)
        env = dict(admin)
        if doc.get("credentials"):
            user = json.loads(_tide("user", "create", USER, "--json", env=admin))
            _tide("acl", "grant", USER, "topic", TOPIC, "produce", env=admin)
            env.update(TIDE_ACCESS_KEY=user["access_key"], TIDE_SECRET_KEY=user["secret_key"])
            time.sleep(2)  # the grant reaches the brokers on their next heartbeat
        return {"variant": variant, **asyncio.run(_workloads(env, seconds, singles))}
    finally:
        _tide("cluster", "down", "--data-dir", str(data_dir))


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"tidelog produce with and without security, {result['date']}, code {result['code']}",
        f"{'variant':<10}{'batch 1000 msgs/s':>19}{'1000 in flight':>16}{'single p50':>12}{'single p99':>12}",
    ]
    base = result["variants"][0]
    for v in result["variants"]:
        s = v["single_sends"]
        lines.append(
            f"{v['variant']:<10}{v['batch_1000_msgs_per_s']:>19,}{v['in_flight_1000_msgs_per_s']:>16,}"
            f"{s['p50_ms']:>10.2f}ms{s['p99_ms']:>10.2f}ms"
        )
    for v in result["variants"][1:]:
        lines.append(
            f"{v['variant']} / plain: batches {v['batch_1000_msgs_per_s'] / base['batch_1000_msgs_per_s']:.2f}x, "
            f"in flight {v['in_flight_1000_msgs_per_s'] / base['in_flight_1000_msgs_per_s']:.2f}x, "
            f"single p50 {v['single_sends']['p50_ms'] / base['single_sends']['p50_ms']:.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.secure", description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="each throughput workload's length")
    ap.add_argument("--singles", type=int, default=2000, help="single sends timed one at a time")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"a comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        ap.error(f"--variants takes {', '.join(VARIANTS)}, not {', '.join(sorted(unknown)) or 'nothing'}")
    work = Path(tempfile.mkdtemp(prefix="tidelog-bench-secure-"))
    try:
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "code": code_version(("broker", "client", "tidelog", "controller")),
            "variants": [run_variant(v, work, args.seconds, args.singles) for v in variants],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
