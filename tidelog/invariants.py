"""Invariants checked in production: a violation is a bug, and the process stops rather than go on.

`require(condition, message)` raises `InvariantViolation` (unlike `assert`, `python -O` keeps it).
Where a violation can surface inside code that otherwise survives errors (a gRPC handler, the HA
loops, the flusher thread), `fail_stop` logs it as critical and ends the process at once with
exit code 70 (EX_SOFTWARE): a replica whose state broke its own rules must not keep serving,
replicating or acknowledging. The controller does the same for its replicated state
(controller/raft.py). The invariants themselves are listed in docs/ARCHITECTURE.md §5.
"""

from __future__ import annotations

import logging
import os
from typing import NoReturn, TypeVar

log = logging.getLogger(__name__)

EXIT_INVARIANT_VIOLATED = 70  # EX_SOFTWARE: a bug, not an operator mistake


class InvariantViolation(AssertionError):
    """The state broke one of its invariants: a bug; the process must stop, not continue."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)


T = TypeVar("T")


def present(value: T | None, message: str) -> T:
    """`value`, which the caller's state guarantees is set; InvariantViolation if it is None."""
    if value is None:
        raise InvariantViolation(message)
    return value


def fail_stop(exc: BaseException) -> NoReturn:
    log.critical("invariant violated: %s; stopping the process", exc)
    logging.shutdown()
    os._exit(EXIT_INVARIANT_VIOLATED)


def stop_if_violated(exc: BaseException) -> None:
    """For catch-all handlers: an InvariantViolation stops the process, anything else returns."""
    if isinstance(exc, InvariantViolation):
        fail_stop(exc)
