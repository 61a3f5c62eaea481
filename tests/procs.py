"""Starting and stopping real tidelog processes in tests, on free loopback ports.

Every process is started with the test's own interpreter (`python -m tidelog.cli ...`), logs to
a file the test can show on failure, and is stopped by its own pid: SIGTERM first, SIGKILL if it
has not exited within a few seconds. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

LOOPBACK = "127.0.0.1"
# The cluster secret every test cluster shares (controllers and brokers alike).
CLUSTER_SECRET = "test-cluster-secret"


_handed_out: set[int] = set()


def free_port() -> int:
    """A port that was free a moment ago (bind port 0 on loopback, then release it).

    The kernel may offer a just-released port again; two processes of one test given the same
    port fail to start, so a port is never handed out twice by this process.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def free_address() -> str:
    return f"{LOOPBACK}:{free_port()}"


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll until `predicate()` is truthy; return its value or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the thing polled for may not be up yet
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}"
                                 + (f" (last error: {last_exc})" if last_exc else ""))
        time.sleep(interval)


class Proc:
    """One child process started by a test."""

    def __init__(self, name: str, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Proc:
        assert self.popen is None or self.popen.poll() is not None, f"{self.name} is already running"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ)
        env.update(self.env or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.popen = subprocess.Popen([sys.executable, "-m", "tidelog.cli", *self.args], stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """Crash the process (no clean shutdown), and reap it."""
        if self.alive():
            assert self.popen is not None
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        self._close_log()

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL if it is still running after `timeout` seconds."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._close_log()
        return self.popen.returncode

    def wait(self, timeout: float) -> int:
        assert self.popen is not None
        rc = self.popen.wait(timeout)
        self._close_log()
        return rc

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class ControllerCluster:
    """1, 3 or 5 controller processes from one generated YAML config."""

    def __init__(self, root: Path, size: int, *, secret: str | None = CLUSTER_SECRET,
                 heartbeat_interval_ms: int = 500, heartbeat_timeout_ms: int = 2000,
                 unclean: bool = False, extra: dict[str, Any] | None = None) -> None:
        self.root = root
        self.ids = [f"c{i + 1}" for i in range(size)]
        self.grpc = {i: free_address() for i in self.ids}
        self.raft = {i: free_address() for i in self.ids}
        doc: dict[str, Any] = {
            "data_dir": str(root / "data"),
            "heartbeat_interval_ms": heartbeat_interval_ms,
            "heartbeat_timeout_ms": heartbeat_timeout_ms,
            "enable_elect_unclean_master": unclean,
            "nodes": [{"id": i, "raft": self.raft[i], "grpc": self.grpc[i]} for i in self.ids],
        }
        if secret:
            doc["secret"] = secret
        doc.update(extra or {})
        self.config_path = root / "controller.yaml"
        self.config_path.write_text(yaml.safe_dump(doc))
        self.procs: dict[str, Proc] = {
            i: Proc(f"controller-{i}", ["controller", "--config", str(self.config_path), "--node-id", i],
                    root / f"{i}.log")
            for i in self.ids
        }

    @property
    def addresses(self) -> list[str]:
        return [self.grpc[i] for i in self.ids]

    @property
    def address_list(self) -> str:
        return ",".join(self.addresses)

    def start(self) -> ControllerCluster:
        for p in self.procs.values():
            p.start()
        return self

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {i} =====\n{self.procs[i].output()[-6000:]}" for i in self.ids)

    def id_of(self, grpc_address: str) -> str:
        return next(i for i, a in self.grpc.items() if a == grpc_address)
