"""Local tidelog processes: free ports, starting `python -m tidelog.cli ...`, waiting, stopping by pid.

Every process is started with this interpreter, logs to a file of its own and is stopped by its
own pid: SIGTERM first, SIGKILL if it has not exited in time. A process recorded by another
command (`tide cluster down` stopping what `tide cluster up` started) is only signalled while its
command line is still the recorded one, so a reused pid is never hit.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tidelog.invariants import require
from tidelog.lab import net
from tidelog.private import open_private

LOOPBACK = "127.0.0.1"

_handed_out: set[tuple[str, int]] = set()


#: Where free ports are drawn from: below the kernel's ephemeral range, which outgoing connections
#: take their local ports from. A port drawn from that range (bind port 0) could be taken by any
#: process's next outgoing connection between the check and the server's own bind, and the
#: server then failed to start ("Address already in use"), as seen in the test suite.
_PORTS_FROM = 20000

#: `i/n`: draw ports only from the i-th of n equal slices of that range (0-based). Runs that start
#: clusters side by side (the test suite's workers) each take a slice of their own, so one never
#: draws a port another drew a moment ago and has not bound yet. Children inherit it.
PORT_SLICE_ENV = "TIDE_PORT_SLICE"


def _port_range() -> tuple[int, int]:
    low, top = _PORTS_FROM, _ephemeral_low()
    spec = os.environ.get(PORT_SLICE_ENV)
    if not spec:
        return low, top
    index, _, count = spec.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        return low, top
    if n < 1 or not 0 <= i < n:
        return low, top
    width = (top - low) // n
    return low + i * width, low + (i + 1) * width


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = LOOPBACK) -> int:
    """A port on `host` that was free a moment ago, drawn at random below the ephemeral range
    (where no outgoing connection takes it meanwhile); bind port 0 where that range is too small.

    Two processes given the same port fail to start, so a port is never handed out twice by
    this process.
    """
    low, top = _port_range()
    for _ in range(200 if top - low >= 1000 else 0):
        port = random.randrange(low, top)
        if (host, port) in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add((host, port))
        return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if (host, port) not in _handed_out:
            _handed_out.add((host, port))
            return port


def free_address(host: str = LOOPBACK) -> str:
    return f"{host}:{free_port(host)}"


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail after `timeout` seconds.

    Fails with AssertionError: in a test that is the failure to show, and a bench stops on it."""
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
            raise AssertionError(
                f"timed out after {timeout:.1f}s waiting for {what}"
                + (f" (last error: {last_exc})" if last_exc else "")
            )
        time.sleep(interval)


# The processes this process started, by pid: poll() on them is exact (/proc is not, right after
# a fork, and a child that exited stays a zombie there until it is reaped).
_children: dict[int, Proc] = {}


class Proc:
    """One `python -m tidelog.cli ARGS` process, logging to `log_path`.

    `new_session`: the process outlives the command that started it (`tide cluster up`);
    `netns`: it runs in that network namespace (`ip netns exec` execs in place, so the pid is
    the tidelog process's own)."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        netns: str | None = None,
        new_session: bool = False,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self.env = env
        self.netns = netns
        self.new_session = new_session
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        require(not self.alive(), f"{self.name} is already running")
        prefix = net.in_netns(self.netns) if self.netns else []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        # The child holds its own copy of the log's descriptor: ours can close at once.
        with os.fdopen(open_private(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as log_file:
            self.popen = subprocess.Popen(
                [*prefix, sys.executable, "-m", "tidelog.cli", *self.args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=self.new_session,
            )
        _children[self.popen.pid] = self
        return self

    @property
    def pid(self) -> int:
        require(self.popen is not None, f"{self.name} was never started")
        return self.popen.pid  # type: ignore[union-attr]

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """Crash the process (no clean shutdown), and reap it."""
        if self.popen is not None and self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL if it is still running after `timeout` seconds; the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        return self.popen.returncode

    def wait(self, timeout: float) -> int:
        require(self.popen is not None, f"{self.name} was never started")
        return self.popen.wait(timeout)  # type: ignore[union-attr]

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""


def proc_args(pid: int) -> list[str]:
    """The command line of a running (not zombie) process, or [] if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return []
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def is_ours(pid: int, args: list[str] | None = None) -> bool:
    """True if `pid` runs `python -m tidelog.cli ARGS` (with `args`: exactly the recorded command,
    whose config path lies in the data directory; a reused pid running anything else is not ours)."""
    parts = proc_args(pid)
    want = ["tidelog.cli", *(args or [])]
    return any(parts[i : i + len(want)] == want for i in range(len(parts)))


def running(pid: int, args: list[str] | None = None) -> bool:
    """Whether `pid` still runs (a stopped process counts as running); see `is_ours` for `args`."""
    child = _children.get(pid)
    if child is not None:
        return child.alive()
    return is_ours(pid, args)


def reap(pid: int) -> bool:
    """Collect a child that exited (a zombie still shows in /proc); True once it is gone."""
    child = _children.get(pid)
    if child is not None:
        return not child.alive()
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return not Path(f"/proc/{pid}").exists() or _zombie(pid)


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    return True


def stop_process(pid: int, timeout: float = 10.0, args: list[str] | None = None) -> None:
    """SIGTERM `pid` if it is still ours, then SIGKILL if it has not exited within `timeout`."""
    if not running(pid, args):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running(pid, args) and time.monotonic() < deadline:
        if reap(pid):
            return
        time.sleep(0.05)
    if running(pid, args):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        reap(pid)
