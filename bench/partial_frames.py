"""What clients announcing large data-port frames and never finishing them cost a broker's memory.

Owns the figure of docs/SECURITY.md's probe row 3. Starts `deploy/local.yaml` with `tide cluster
up` in a temporary directory, opens `--clients` connections to a broker's data port, sends on
each a produce frame header announcing `--frame-mib` MiB and the body one byte short, and prints
the broker's RSS (from /proc) before and after; then stops the cluster. Run from the repository
root (about 30 s):

    python -m bench.partial_frames                  # 16 clients x 64 MiB
    python -m bench.partial_frames --clients 4 --frame-mib 16 --json

Without the data port's budget for partial frames (`data_partial_frame_bytes`) each connection
held its whole body; with it, one frame at a time is read and the rest wait unread, and a body
over 8 MiB waits in a spill file until whole: +4 MiB of RSS (the connections' stream buffers),
where holding the one 64 MiB frame being read cost +67 MiB (target: at most +64 MiB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from tidelog import dataport_frames as df
from tidelog.client import AsyncClient
from tidelog.localcluster import client_options, wait_until
from tidelog.proto import broker_pb2 as bpb

REPO = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    return rss_bytes(pid) / (1 << 20)


def data_port(state: dict[str, object], data_dir: Path, name: str) -> tuple[str, int]:
    listen = yaml.safe_load((data_dir / f"{name}.yaml").read_text())["listen"]

    async def status() -> str:
        async with AsyncClient(str(state["controllers"]), **client_options(state)) as client:
            return str((await client.call_broker(listen, "Status", bpb.StatusRequest())).data_address)

    host, _, port = asyncio.run(status()).rpartition(":")
    return host, int(port)


def rss_bytes(pid: int) -> int:
    """Process `pid`'s resident set, in bytes (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def unfinished_frames(
    address: tuple[str, int],
    clients: int,
    frame: int,
    wait_s: float = 60,
    held: Callable[[], object] | None = None,
) -> Iterator[None]:
    """`clients` connections to a data port, each sending a produce frame of `frame` bytes one byte
    short (never whole), held open while the block runs and closed after it. The block runs once
    the sends end: the broker stops reading (back-pressure: they time out) or closes; both bound
    it. With `held`, it runs as soon as `held()` is true instead (the caller sees the broker hold
    what it will), waited for at most `wait_s`; the sends still blocked end when the block does."""
    head = df.HEAD.pack(frame + df.HEAD_SIZE - 4, df.OP_PRODUCE, 1)
    body = b"\0" * (frame - 1)
    socks = [socket.create_connection(address, timeout=15) for _ in range(clients)]

    def send(s: socket.socket) -> None:
        with contextlib.suppress(OSError):
            s.sendall(head + body)

    threads = [threading.Thread(target=send, args=(s,)) for s in socks]
    try:
        for t in threads:
            t.start()
        if held is None:
            for t in threads:
                t.join(wait_s)
        else:
            wait_until(held, wait_s, interval=0.05, what="the broker to hold the unfinished frames")
        yield
    finally:
        for s in socks:
            # shutdown, unlike close, wakes a sendall blocked on the socket in its thread
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in threads:
            t.join(wait_s)


def probe(address: tuple[str, int], pid: int, clients: int, frame: int) -> dict[str, float]:
    before = rss_mib(pid)
    with unfinished_frames(address, clients, frame):
        peak = rss_mib(pid)
        time.sleep(2)
        peak = max(peak, rss_mib(pid))
    return {"rss_before_mib": round(before, 1), "rss_with_partial_frames_mib": round(peak, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--frame-mib", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tide = [sys.executable, "-m", "tidelog.cli"]
    with tempfile.TemporaryDirectory(prefix="tide-partial-") as tmp:
        data_dir = Path(tmp) / "cluster"
        up = subprocess.run(
            [
                *tide,
                "cluster",
                "up",
                "-c",
                str(REPO / "deploy" / "local.yaml"),
                "--data-dir",
                str(data_dir),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=180,
        )
        try:
            state = json.loads(up.stdout)
            broker = next(p for p in state["processes"] if p["kind"] == "broker")
            address = data_port(state, data_dir, broker["name"])
            out = probe(address, broker["pid"], args.clients, args.frame_mib << 20)
        finally:
            subprocess.run(
                [*tide, "cluster", "down", "--data-dir", str(data_dir)], capture_output=True, timeout=120
            )
    out.update(clients=args.clients, frame_mib=args.frame_mib)
    out["added_mib"] = round(out["rss_with_partial_frames_mib"] - out["rss_before_mib"], 1)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.clients} clients x {args.frame_mib} MiB frames one byte short: broker RSS "
            f"{out['rss_before_mib']} -> {out['rss_with_partial_frames_mib']} MiB (+{out['added_mib']} MiB)"
        )


if __name__ == "__main__":
    main()
