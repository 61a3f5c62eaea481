"""Process logging: the one place a broker, a controller or the CLI sets `logging` up.

Two formats (`log_format` in the broker and controller configs, `--log-format` on the command):

- `text` (the default): ``<time> <LEVEL> <logger> [<tag>] <message>``, the lines people read;
- `json`: one JSON object per line, for log shippers. Every object has ``time`` (ISO 8601, UTC,
  milliseconds), ``level``, ``logger`` and ``message``; then the process identity — for a broker
  ``broker_set``, ``broker_id``, ``role`` and ``epoch``, for a controller ``node_id`` and
  ``term`` — read from the live state *when the record is emitted*, so a line written after a
  promotion carries the new role and epoch; then whatever the log call passed as ``extra=``
  (offsets, another broker set's name); ``exc`` holds a traceback when there is one.

Where: standard error by default; with a file (`log_file` in the configs) a size-rotated file,
`log_max_bytes` each and `log_backups` old ones kept (`app.log.1` ... `app.log.N`), so a process's
logs take at most (log_backups + 1) × log_max_bytes of disk. The files are private (0600).

The identity comes from a callable the process registers with `identify` once it knows who it
is; a field the log call names itself (``extra={"broker_set": ...}``) wins over the identity's.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from tidelog import private

_log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_BACKUPS = 4

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: Called on every record: the fields that say which process (and in which state) wrote it.
Identity = Callable[[], Mapping[str, Any]]

# Attributes every LogRecord has; anything else on a record came from `extra=` or the identity.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class IdentityFilter(logging.Filter):
    """Adds the process identity to each record that reaches the handler it is installed on."""

    def __init__(self) -> None:
        super().__init__()
        self.source: Identity | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        source = self.source
        if source is None:
            return True
        try:
            fields = source()
        except Exception:  # a half-built process: the line matters more than its labels
            return True
        for key, value in fields.items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


def _utc_iso(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _utc_iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def text_formatter(tag: str = "") -> logging.Formatter:
    """The readable format: time, level, logger, the process tag in brackets, the message."""
    middle = f" [{tag}]" if tag else ""
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s" + middle + " %(message)s")


#: The one identity filter of this process (installed on the handler by `configure`).
IDENTITY = IdentityFilter()


def identify(source: Identity | None) -> None:
    """Name the process in every record from now on (None: stop adding fields)."""
    IDENTITY.source = source


def configure(
    fmt: str = "text",
    level: str | int = "INFO",
    *,
    tag: str = "",
    file: str = "",
    max_bytes: int = DEFAULT_MAX_BYTES,
    backups: int = DEFAULT_BACKUPS,
) -> None:
    """Send the root logger's records to standard error (or `file`, rotated at `max_bytes` with
    `backups` old files kept) in `fmt`, replacing any earlier handler.

    Under `json`, warnings and uncaught exceptions go through logging too, so that every line
    the process writes is one JSON object."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler: logging.Handler
    if file:
        # the rotated files are created by the handler: only the umask makes them private
        private.restrict_umask()
        handler = logging.handlers.RotatingFileHandler(
            file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        os.chmod(file, private.FILE_MODE)  # one an older version (or another umask) made
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else text_formatter(tag))
    handler.addFilter(IDENTITY)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    if fmt == "json":
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_thread_uncaught
        sys.unraisablehook = _log_unraisable


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    _log.critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_thread_uncaught(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    _log.error(
        "uncaught exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
    )


def _log_unraisable(args: Any) -> None:
    # `sys.UnraisableHookArgs`: an exception in a finaliser or at interpreter shutdown
    what = args.err_msg or "Exception ignored in"
    exc = (args.exc_type, args.exc_value, args.exc_traceback) if args.exc_value is not None else None
    _log.warning("%s: %r", what, args.object, exc_info=exc)
