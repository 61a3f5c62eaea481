"""The WAN relay: adds latency to TCP between datacenters, since this kernel has no `netem`.

It runs in the lab's router namespace. nftables there redirects every TCP connection from one
datacenter to another to this relay (lab/rules.py `render_nat`); the relay reads the original
destination (`SO_ORIGINAL_DST`), connects to it, and copies bytes both ways, holding each chunk
for the delay of its direction before writing it on. Order is kept per direction, so a stream
sees a fixed added one-way latency. Delays come from a JSON file (`{"delays": {"dc-a>dc-b": 20}}`
in ms, `"sites": {"100": "dc-a"}` mapping the second address octet to a datacenter) and are
read again on SIGHUP: a new delay applies to the next chunk of every open connection.

    python -m tidelog.lab.relay --config lab/relay.json --port 7999
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import struct
import time

log = logging.getLogger(__name__)

SO_ORIGINAL_DST = 80
CHUNK = 256 * 1024


class Relay:
    def __init__(self, config_path: str) -> None:
        self.config_path = config_path
        self.sites: dict[str, str] = {}
        self.delays: dict[str, float] = {}
        self.reload()

    def reload(self) -> None:
        with open(self.config_path) as f:
            doc = json.load(f)
        self.sites = {str(k): str(v) for k, v in doc.get("sites", {}).items()}
        self.delays = {str(k): float(v) / 1000.0 for k, v in doc.get("delays", {}).items()}
        log.info("relay delays now %s", doc.get("delays"))

    def _site(self, address: str) -> str:
        parts = address.split(".")
        return self.sites.get(parts[1], "?") if len(parts) == 4 else "?"

    def delay(self, src: str, dst: str) -> float:
        return self.delays.get(f"{self._site(src)}>{self._site(dst)}", 0.0)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        peer = writer.get_extra_info("peername")[0]
        try:
            raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            port, packed = struct.unpack("!2xH4s8x", raw)
            dst = socket.inet_ntoa(packed)
            r2, w2 = await asyncio.open_connection(dst, port)
        except OSError as exc:
            log.info("relay %s -> ?: %s", peer, exc)
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, w2, peer, dst), self._pipe(r2, writer, dst, peer), return_exceptions=True
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, src: str, dst: str
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((time.monotonic() + self.delay(src, dst), data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(OSError):
                writer.close()


async def serve(config_path: str, port: int) -> None:
    relay = Relay(config_path)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, relay.reload)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = await asyncio.start_server(relay.handle, "0.0.0.0", port, reuse_address=True)
    log.info("relay listening on :%d", port)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(args.config, args.port))


if __name__ == "__main__":
    main()
