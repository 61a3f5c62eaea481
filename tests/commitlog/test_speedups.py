"""The C loops of the record-batch path (commitlog/_speedups.c) against their Python twins
(commitlog/speedups.py): on any input, valid or damaged, a C function returns exactly what its
twin returns, or None where the twin raises (the caller then runs the twin, which names the
problem). Hypothesis drives both with the same batches; the whole append → replicate → read path
runs once each way and must leave the same bytes."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.commitlog.test_batch import Out as Attrs  # a message with attributes, not a tuple
from tidelog.client.aio import OutMessage
from tidelog.commitlog import CommitLog, batch, replication, speedups
from tidelog.commitlog import append as appendmod
from tidelog.commitlog import record as rec
from tidelog.errors import TidelogError


def test_the_c_loops_are_built_where_a_compiler_and_headers_are():
    """`pip install` builds the module where it can; a silent build failure would leave every
    broker on the slow loops, so a machine that could build it must have it."""
    can_build = shutil.which("cc") or shutil.which("gcc")
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not (can_build and headers):
        pytest.skip("no C compiler or Python headers here: the Python loops serve")
    assert speedups.available()


native = pytest.mark.skipif(not speedups.available(), reason="the C module is not built here")
C = speedups._native  # the module itself, whatever `use` chose for the process

TOPIC = b"orders"
values = st.text(max_size=12)
properties = st.dictionaries(
    st.text(min_size=1, max_size=6).filter(lambda k: k not in rec.RESERVED_PROPERTIES), values, max_size=2
)


messages = st.builds(
    OutMessage, st.binary(max_size=200), st.none() | values, st.none() | values, st.none() | properties
) | st.builds(Attrs, st.binary(max_size=50), st.none() | values, st.none() | values, st.none() | properties)


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except (TidelogError, ValueError, struct.error) as exc:
        return "raised", type(exc)


def _damage(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for at, value in edits:
        if out:
            out[at % len(out)] = value
    return bytes(out[:cut] if cut is not None else out)


damage = st.tuples(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=3),
    st.none() | st.integers(0, 5000),
)


@native
@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000))
def test_crc32c_is_the_packages(data):
    from crc32c import crc32c

    assert C.crc32c(data) == crc32c(data)


@native
@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(0, (1 << 32) - 1), st.booleans())
def test_the_projects_crc32c_continues_a_running_value_as_the_package_does(head, tail, value, big):
    """commitlog/crc.py's `crc32c` is the C module's: from a running value it gives the package's
    answer, the CRC of the parts chained equals the CRC of the whole, and the buffers that are
    checksummed with the interpreter lock released (32 KiB and up) give the same answers."""
    import crc32c as package

    from tidelog.commitlog.crc import crc32c

    assert crc32c is C.crc32c  # the package is the fallback only, where the module is not built
    if big:
        tail = tail * (40_000 // max(len(tail), 1) + 1) if tail else bytes(40_000)
    assert crc32c(tail, value) == package.crc32c(tail, value)
    assert crc32c(tail, crc32c(head)) == crc32c(head + tail) == package.crc32c(head + tail)
    assert crc32c(memoryview(head + tail)[len(head) :]) == package.crc32c(tail)


@native
def test_a_broker_or_client_process_does_not_import_the_crc32c_package():
    """The package's `__init__` reads its version through importlib.metadata: 30 ms of every
    broker's, controller's and `tide` command's start, for a function the C module has."""
    probe = (
        "import sys, tidelog.broker.server, tidelog.client.aio, tidelog.ledger.digest, tidelog.cli; "
        "print(sorted(m for m in ('crc32c', 'importlib.metadata') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


@native
@pytest.mark.parametrize("value", [-1, 1 << 32, 1 << 70])
def test_a_running_value_that_is_no_crc32c_is_refused(value):
    from tidelog.commitlog.crc import crc32c

    with pytest.raises(ValueError, match="running value"):
        crc32c(b"data", value)


@native
@settings(max_examples=200, deadline=None)
@given(st.lists(messages, max_size=12), st.integers(0, 70000), st.integers(-5, 1 << 65))
def test_encode_batch_is_the_python_encoder(msgs, queue, born):
    want = _outcome(batch._encode_batch_py, TOPIC, queue, msgs, born)
    in_range = 0 <= queue <= 0xFFFF_FFFF and 0 <= born <= speedups.I64
    got = C.encode_batch(TOPIC, queue, msgs, born, rec.encode_properties) if in_range else None
    if got is None:
        assert want[0] == "raised" or not in_range or any(not isinstance(m.body, bytes) for m in msgs)
    else:
        assert want == ("ok", got)
    assert _outcome(batch.encode_batch, TOPIC, queue, msgs, born) == want


def test_a_plain_tuple_is_not_taken_for_a_message():
    """Only a named tuple with the fields (body, key, tags, properties) is read by position."""
    assert _outcome(batch.encode_batch, TOPIC, 0, [(b"x", None, None, None)], 1)[0] == "raised"


def _header_damage(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Set byte `at` (of the header, topic and first property bytes) of record `i` to `value`."""
    out = bytearray(data)
    starts, pos = [], 0
    while pos + 4 <= len(data):
        starts.append(pos)
        pos += max(struct.unpack_from(">I", data, pos)[0], 1)
    for i, at, value in edits:
        where = starts[i % len(starts)] + at
        if where < len(out):
            out[where] = value
    return bytes(out)


header_damage = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 90), st.integers(0, 255)), max_size=2)


@native
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(messages, min_size=1, max_size=10),
    damage,
    header_damage,
    st.integers(0, 3),
    st.integers(60, 400),
)
def test_check_batch_agrees_or_declines(msgs, dmg, hdmg, extra, max_record):
    data = _damage(_header_damage(batch._encode_batch_py(TOPIC, 0, msgs, 7), hdmg), *dmg)
    count = len(msgs) + (extra if extra < 2 else 0)
    want = _outcome(batch._check_batch_py, data, TOPIC, 0, count, max_record)
    got = C.check_batch(data, TOPIC, 0, count, max_record)
    if got is None:
        assert want[0] == "raised"
    else:
        assert want == ("ok", [tuple(c) for c in got])
    assert _outcome(batch.check_batch, data, TOPIC, 0, count, max_record) == want


@native
@settings(max_examples=200, deadline=None)
@given(
    st.lists(messages, min_size=1, max_size=12),
    st.integers(0, 3),
    st.integers(0, 3000),
    st.sampled_from([512, 1024, 4096, 1 << 20]),
    st.integers(0, 1 << 40),
)
def test_stamping_is_the_python_loop(msgs, epoch, start, seg_bytes, store_ts):
    data = batch._encode_batch_py(TOPIC, 0, msgs, 0)
    checked = batch._check_batch_py(data, TOPIC, 0, len(msgs), 1 << 20)
    if max(c.size for c in checked) > seg_bytes - rec.BLANK_SIZE:
        return  # the log refuses such a record before stamping
    py, c = bytearray(data), bytearray(data)
    want = appendmod._stamp(py, checked, 0, epoch, 5, start, seg_bytes, store_ts)
    got = C.stamp_batch(c, checked, 0, epoch, 5, start, seg_bytes, store_ts)
    assert got == want and c == py


def _stored(tmp_path, msgs_per_batch: list[list[OutMessage]], seg_bytes: int) -> bytes:
    log = CommitLog.open(str(tmp_path), segment_bytes=seg_bytes, flush="async")
    try:
        for i, msgs in enumerate(msgs_per_batch):
            topic = "orders" if i % 2 == 0 else "refunds"
            log.append_encoded(
                topic, i % 3, bytearray(batch.encode_batch(topic.encode(), i % 3, msgs, 3)), len(msgs)
            )
        chunk, _ = log.read_raw_chunk(0, 1 << 24)
        out = chunk
        while len(out) < log.max_offset:
            more, _ = log.read_raw_chunk(len(out), 1 << 24)
            out += more
        return out
    finally:
        log.close()


@native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.lists(messages, min_size=1, max_size=5), min_size=1, max_size=6), damage, st.integers(0, 2)
)
def test_split_raw_agrees_or_declines(tmp_path_factory, batches, dmg, at_shift):
    seg_bytes = 4096
    msgs = [[OutMessage(m.body[:300], m.key, m.tags, m.properties) for m in b] for b in batches]
    data = _stored(tmp_path_factory.mktemp("log"), msgs, seg_bytes)
    data = _damage(data, *dmg) if dmg != ([], None) else data
    at = at_shift * 8  # a wrong start is an offset mismatch

    def python():
        spans, units, end = replication._split(data, at, seg_bytes)
        return spans, replication._runs(data, units), end

    want = _outcome(python)
    got = C.split_raw(data, at, seg_bytes)
    if got is None:
        assert want[0] == "raised"
    else:
        assert want == ("ok", got)


@native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(messages, min_size=1, max_size=8), damage, st.booleans())
def test_walk_agrees_or_declines(tmp_path_factory, msgs, dmg, verify):
    data = _damage(_stored(tmp_path_factory.mktemp("log"), [list(msgs)], 1 << 20), *dmg)
    before, speedups.native = speedups.native, None
    try:
        want = _outcome(batch.walk, data, "x", 0, verify)
    finally:
        speedups.native = before
    got = C.walk(data, verify)
    if got is None:
        assert want[0] == "raised"
    else:
        assert want == ("ok", got)


def _round_trip(tmp_path, on: bool) -> tuple[bytes, bytes, list[tuple[str, bytes, str | None, str | None]]]:
    """Produce batches into a master log, replicate its bytes to a slave log, read them back."""
    before = speedups.native
    speedups.use(on)
    try:
        master = CommitLog.open(str(tmp_path / "m"), segment_bytes=4096, flush="async", clock=lambda: 1.7e9)
        slave = CommitLog.open(str(tmp_path / "s"), segment_bytes=4096, flush="async", clock=lambda: 1.7e9)
        try:
            for i in range(20):
                msgs = [
                    OutMessage(bytes([i]) * (50 + 30 * j), f"k{j}", "a" if j % 2 else None) for j in range(6)
                ]
                master.append_encoded("t", i % 2, bytearray(batch.encode_batch(b"t", i % 2, msgs, 9)), 6)
            while slave.max_offset < master.max_offset:
                chunk, _ = master.read_raw_chunk(slave.max_offset, 3000)
                slave.append_raw(slave.max_offset, chunk)
            for log in (master, slave):
                log.confirm_offset = log.max_offset
            read = [(m.topic, m.body, m.key, m.tags) for q in (0, 1) for m in slave.read("t", q, 0, 100)]
            raw, _ = slave.read_encoded("t", 1, 0, 100, 1 << 20)
            return master.read_raw_chunk(0, 4096)[0], raw, read
        finally:
            master.close()
            slave.close()
    finally:
        speedups.native = before


@native
def test_append_replicate_and_read_leave_the_same_bytes_either_way(tmp_path):
    c = _round_trip(tmp_path / "c", True)
    py = _round_trip(tmp_path / "py", False)
    assert len(c[2]) == 120 and c == py
