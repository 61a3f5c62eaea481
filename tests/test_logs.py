"""tidelog/logs.py: the JSON formatter, the live process identity, `configure`, the config keys."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tidelog import logs
from tidelog.broker import config as bcfg
from tidelog.controller import config as ccfg
from tidelog.errors import ConfigError


def _record(msg: str = "hello %s", args: tuple[Any, ...] = ("world",), **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("tidelog.test", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`configure` changes process-wide state: put it all back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        sys.excepthook, threading.excepthook, sys.unraisablehook = hooks
        logging.captureWarnings(False)
        logs.identify(None)


def test_json_line_has_time_level_logger_message_and_the_call_s_fields() -> None:
    line = logs.JsonFormatter().format(_record(max_offset=4096, broker_set="broker-b"))
    doc = json.loads(line)
    assert doc["level"] == "WARNING"
    assert doc["logger"] == "tidelog.test"
    assert doc["message"] == "hello world"
    assert doc["max_offset"] == 4096 and doc["broker_set"] == "broker-b"
    assert doc["time"].endswith("Z") and "T" in doc["time"]
    # nothing of LogRecord's own bookkeeping leaks in
    assert not {"args", "msg", "levelno", "pathname", "created", "exc_info"} & set(doc)


def test_a_multi_line_message_and_a_traceback_stay_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "a\nb", (), sys.exc_info())
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "a\nb"
    assert "ValueError: boom" in doc["exc"]


def test_values_json_cannot_encode_are_written_as_text() -> None:
    doc = json.loads(logs.JsonFormatter().format(_record(peer=("127.0.0.1", 5), path=object())))
    assert doc["peer"] == ["127.0.0.1", 5]
    assert doc["path"].startswith("<object")


def test_the_identity_is_read_when_each_record_is_written() -> None:
    state = {"broker_set": "broker-a", "broker_id": 1, "role": "slave", "epoch": 3}
    f = logs.IdentityFilter()
    f.source = lambda: dict(state)
    first = _record()
    f.filter(first)
    state.update(role="master", epoch=4)  # a promotion between two lines
    second = _record()
    f.filter(second)
    assert (first.role, first.epoch) == ("slave", 3)
    assert (second.role, second.epoch, second.broker_id) == ("master", 4, 1)


def test_a_field_the_log_call_names_wins_over_the_identity() -> None:
    f = logs.IdentityFilter()
    f.source = lambda: {"broker_set": "mine", "epoch": 1}
    record = _record(broker_set="other")
    f.filter(record)
    assert record.broker_set == "other" and record.epoch == 1


def test_an_identity_that_fails_does_not_lose_the_line() -> None:
    def broken() -> dict[str, Any]:
        raise AttributeError("not built yet")

    f = logs.IdentityFilter()
    f.source = broken
    assert f.filter(_record()) is True


def test_configure_json_writes_one_object_per_line_with_the_identity(restore_logging: None) -> None:
    stream = io.StringIO()
    saved, sys.stderr = sys.stderr, stream
    try:
        logs.configure("json", "INFO")
    finally:
        sys.stderr = saved
    logs.identify(lambda: {"broker_set": "broker-a", "broker_id": 2, "role": "master", "epoch": 7})
    log = logging.getLogger("tidelog.broker.replica")
    log.warning("promoted to master of epoch %d", 7, extra={"max_offset": 123})
    log.debug("not shown at INFO")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["broker_set"] == "broker-a" and doc["broker_id"] == 2 and doc["epoch"] == 7
    assert doc["max_offset"] == 123 and doc["message"] == "promoted to master of epoch 7"


def test_configure_text_keeps_the_readable_line(restore_logging: None) -> None:
    stream = io.StringIO()
    saved, sys.stderr = sys.stderr, stream
    try:
        logs.configure("text", "INFO", tag="broker-a")
    finally:
        sys.stderr = saved
    logging.getLogger("tidelog.x").info("started")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" INFO tidelog.x [broker-a] started")


def test_configure_refuses_an_unknown_format(restore_logging: None) -> None:
    with pytest.raises(ValueError, match="text, json"):
        logs.configure("xml")


@pytest.mark.parametrize("value", ["json", "text"])
def test_the_config_keys_take_text_and_json(value: str) -> None:
    broker = bcfg.from_mapping(
        {"broker_set": "b", "data_dir": "/tmp/x", "controllers": "h:1", "secret": "s", "log_format": value}
    )
    assert broker.log_format == value
    nodes = [{"id": "c1", "raft": "127.0.0.1:1", "grpc": "127.0.0.1:2"}]
    assert ccfg.parse({"nodes": nodes, "data_dir": "/tmp/x", "log_format": value}).log_format == value


def test_the_config_keys_refuse_anything_else() -> None:
    with pytest.raises(ConfigError) as broker_err:
        bcfg.from_mapping(
            {
                "broker_set": "b",
                "data_dir": "/tmp/x",
                "controllers": "h:1",
                "secret": "s",
                "log_format": "xml",
            }
        )
    assert broker_err.value.details["key"] == "log_format"
    nodes = [{"id": "c1", "raft": "127.0.0.1:1", "grpc": "127.0.0.1:2"}]
    with pytest.raises(ConfigError) as controller_err:
        ccfg.parse({"nodes": nodes, "data_dir": "/tmp/x", "log_format": "JSON"})
    assert controller_err.value.details["key"] == "log_format"
    assert bcfg.from_mapping({"broker_set": "b", "data_dir": "/x", "controllers": "h:1"}).log_format == "text"
