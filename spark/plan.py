"""The decisions of the Spark source, as pure functions: no Spark, no network, no clocks.

Everything here can be tested exhaustively; `tidelog.spark.source` and `tidelog.spark.fetch`
only move data and call these.

- Options: `ReadOptions.parse` turns Spark's string options into typed values.
- Offsets: a queue is named `(topic, broker set, queue id)`; on the wire and in Spark's
  checkpoint an offset map is JSON `{"topic": {"broker-a:0": 42, ...}}` (string keys, because
  Spark round-trips offsets through JSON). `-2` means earliest and `-1` latest, as in Kafka.
- Planning: `resolve_ranges` turns the options and what the cluster said about each queue
  (min offset, confirmed offset) into one `[start, end)` per queue; ends never pass the confirmed
  offset, because a failover can take back anything past it. `split_range` cuts big ranges so
  one queue can be read by several tasks.
- Streaming: `budget` spreads `maxOffsetsPerTrigger` over the queues in proportion to their
  backlog; `next_offsets` never moves a queue backwards (a lagging replica may report a lower
  confirmed offset than the master did a moment ago).
- Retention: `check_start` is the failOnDataLoss decision (Kafka's meaning): fail, or skip to
  the log's minimum offset.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import InvalidArgumentError, OffsetBelowRetentionError

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1

QueueId = tuple[str, str, int]  # (topic, broker set, queue id)
Offsets = dict[QueueId, int]

CONTROLLERS_ENV = "TIDE_CONTROLLERS"

# The columns the source can produce, in order, with their Spark types.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("broker_set", "string"),
    ("queue", "int"),
    ("offset", "bigint"),
    ("key", "string"),
    ("tags", "string"),
    ("body", "binary"),
    ("timestamp", "timestamp"),
)
HEADERS_COLUMN = ("headers", "map<string,string>")


def schema_ddl(include_headers: bool) -> str:
    """The source's schema as a Spark DDL string; `headers` only with includeHeaders (as Kafka)."""
    cols = COLUMNS + ((HEADERS_COLUMN,) if include_headers else ())
    return ", ".join(f"{name} {kind}" for name, kind in cols)


# --- queue names and offset JSON ------------------------------------------------------------


def queue_name(broker_set: str, queue: int) -> str:
    return f"{broker_set}:{queue}"


def parse_queue_name(name: str) -> tuple[str, int]:
    """`"broker-a:3"` -> `("broker-a", 3)`; broker set names may not hold ':' but topics may."""
    bs, sep, q = name.rpartition(":")
    if not sep or not bs or not q.isdigit():
        raise InvalidArgumentError(
            f"bad queue name {name!r}: expected '<broker set>:<queue id>', e.g. 'broker-a:0'"
        )
    return bs, int(q)


def offsets_to_json(offsets: Mapping[QueueId, int]) -> dict[str, dict[str, int]]:
    """The JSON-ready form: `{"topic": {"broker-a:0": 42}}`, keys sorted for stable checkpoints."""
    out: dict[str, dict[str, int]] = {}
    for (topic, bs, q), off in sorted(offsets.items()):
        out.setdefault(topic, {})[queue_name(bs, q)] = int(off)
    return out


def offsets_from_json(doc: Any, *, what: str = "offsets", allow_special: bool = False) -> Offsets:
    """Parse `{"topic": {"broker-a:0": 42}}` (a dict, or its JSON text) into an offset map.

    `allow_special` admits Kafka's -2 (earliest) and -1 (latest) in options; checkpointed offsets
    are always real offsets.
    """
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f'{what} must be a JSON object {{"topic": {{"broker-a:0": 42}}}}')
    out: Offsets = {}
    low = EARLIEST if allow_special else 0
    for topic, queues in doc.items():
        if not isinstance(topic, str) or not topic or not isinstance(queues, dict):
            raise InvalidArgumentError(f"{what}: each topic must map to an object of queue offsets")
        for name, off in queues.items():
            bs, q = parse_queue_name(name)
            if isinstance(off, bool) or not isinstance(off, int) or off < low:
                raise InvalidArgumentError(
                    f"{what}: offset of {topic} {name} must be an integer >= {low}, not {off!r}"
                )
            out[(topic, bs, q)] = off
    return out


@dataclass(frozen=True)
class OffsetSpec:
    """startingOffsets / endingOffsets: `earliest`, `latest`, or explicit per-queue offsets.

    Queues an explicit map does not name take `default` (earliest for a start, latest for an end).
    """

    default: int  # EARLIEST or LATEST
    explicit: Mapping[QueueId, int] = field(default_factory=dict)

    def for_queue(self, qid: QueueId) -> int:
        return self.explicit.get(qid, self.default)


def parse_offset_spec(text: str | None, *, option: str, default: int) -> OffsetSpec:
    if text is None or not text.strip():
        return OffsetSpec(default)
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    return OffsetSpec(default, offsets_from_json(text, what=option, allow_special=True))


# --- options -------------------------------------------------------------------------------


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"option {name} must be true or false, not {raw!r}")


def _int(options: Mapping[str, str], name: str, default: int | None, low: int = 1) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name} must be an integer, not {raw!r}") from None
    if value < low:
        raise InvalidArgumentError(f"option {name} must be >= {low}, not {value}")
    return value


def _float(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name} must be a number of seconds, not {raw!r}") from None
    if not value > 0:
        raise InvalidArgumentError(f"option {name} must be positive, not {value}")
    return value


def controllers_option(options: Mapping[str, str]) -> str:
    """The `controllers` option: controllers' and brokers' gRPC addresses alike (a broker answers
    the route lookups planning needs, so a job plans and reads while no controller answers)."""
    controllers = (options.get("controllers") or os.environ.get(CONTROLLERS_ENV, "")).strip()
    if not controllers:
        raise InvalidArgumentError(
            "option controllers is required (host:port[,host:port...], controllers' or brokers')",
            hint=f"or set {CONTROLLERS_ENV} in the environment of the Spark processes",
        )
    return controllers


@dataclass(frozen=True)
class Connection:
    """How every Spark process connects (options, lower-cased): `caFile`, the CA a TLS cluster's
    certificates are verified with (the same file on every process; unset: $TIDE_CA_FILE of each
    process, else plain text), and `accessKey`/`secretKey`, the user whose credentials sign every
    call when the cluster has auth on (unset: $TIDE_ACCESS_KEY/$TIDE_SECRET_KEY of each process)."""

    ca_file: str | None = None
    access_key: str | None = None
    secret_key: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Connection:
        access_key, secret_key = options.get("accesskey") or None, options.get("secretkey") or None
        if (access_key is None) != (secret_key is None):
            raise InvalidArgumentError("options accessKey and secretKey go together")
        return cls(options.get("cafile") or None, access_key, secret_key)

    def client_options(self) -> dict[str, str | None]:
        """The AsyncClient keyword arguments."""
        return {"ca_file": self.ca_file, "access_key": self.access_key, "secret_key": self.secret_key}


@dataclass(frozen=True)
class ReadOptions:
    """The source's options, typed. Names follow Spark's Kafka source where the meaning matches."""

    controllers: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    include_headers: bool = False
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    max_offsets_per_partition: int = 100_000
    fetch_max_messages: int = 4096
    read_timeout_s: float = 60.0
    connection: Connection = Connection()

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        one, many = opts.get("topic"), opts.get("topics")
        if one and many:
            raise InvalidArgumentError("give option topic or option topics, not both")
        topics = (
            tuple(t.strip() for t in (one or many or "").split(",") if t.strip()) if (one or many) else ()
        )
        if one and len(topics) != 1:
            raise InvalidArgumentError(f"option topic names one topic, not {one!r} (use topics for several)")
        if not topics:
            raise InvalidArgumentError("option topic (or topics, comma-separated) is required")
        if len(set(topics)) != len(topics):
            raise InvalidArgumentError(f"option topics names a topic twice: {many!r}")
        # Kafka's defaults: a batch reads everything confirmed; a stream starts at the end.
        starting = parse_offset_spec(
            opts.get("startingoffsets"), option="startingOffsets", default=LATEST if streaming else EARLIEST
        )
        if streaming and opts.get("endingoffsets"):
            raise InvalidArgumentError("option endingOffsets is for batch reads only")
        ending = parse_offset_spec(opts.get("endingoffsets"), option="endingOffsets", default=LATEST)
        if not streaming and "maxoffsetspertrigger" in opts:
            raise InvalidArgumentError("option maxOffsetsPerTrigger is for streaming reads only")
        if ending.default == EARLIEST and not ending.explicit:
            raise InvalidArgumentError("endingOffsets=earliest reads nothing; use latest or a JSON map")
        for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
            unknown = {t for t, _, _ in spec.explicit} - set(topics)
            if unknown:
                raise InvalidArgumentError(f"{name} names topics that are not read: {sorted(unknown)}")
        return cls(
            controllers=controllers_option(opts),
            topics=topics,
            starting=starting,
            ending=ending,
            include_headers=bool_option(opts, "includeHeaders", False),
            fail_on_data_loss=bool_option(opts, "failOnDataLoss", True),
            max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None),
            max_offsets_per_partition=_int(opts, "maxOffsetsPerPartition", 100_000) or 100_000,
            fetch_max_messages=_int(opts, "fetchMaxMessages", 4096) or 4096,
            read_timeout_s=_float(opts, "readTimeout", 60.0),
            connection=Connection.parse(opts),
        )


# --- planning ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueState:
    """What planning learned about one queue from the cluster."""

    topic: str
    broker_set: str
    queue: int
    min: int  # lowest offset retention has kept
    confirmed: int  # readers see offsets below this

    @property
    def qid(self) -> QueueId:
        return (self.topic, self.broker_set, self.queue)


@dataclass(frozen=True)
class Range:
    """The offsets `[start, end)` of one queue that one Spark task reads."""

    topic: str
    broker_set: str
    queue: int
    start: int
    end: int
    earliest: bool = False  # the start is "whatever retention kept": skipping is not data loss

    @property
    def qid(self) -> QueueId:
        return (self.topic, self.broker_set, self.queue)

    def __len__(self) -> int:
        return self.end - self.start


def check_start(start: int, min_offset: int, end: int, *, fail_on_data_loss: bool, where: str) -> int:
    """Where reading really starts when retention may have deleted `[start, min_offset)`.

    With failOnDataLoss (the default) a start below the minimum is an error: the job asked for
    data that no longer exists. Without it, reading skips ahead to the minimum (never past `end`).
    """
    if start >= min_offset:
        return start
    if fail_on_data_loss:
        err = OffsetBelowRetentionError(
            start,
            min_offset,
            what=f"start offset of {where}",
            hint="retention deleted these messages; start from the current "
            "minimum, or set failOnDataLoss=false to skip ahead",
        )
        raise err
    log.warning(
        "%s: offsets %d..%d were deleted by retention; skipping to %d (failOnDataLoss=false)",
        where,
        start,
        min_offset,
        min(min_offset, end),
    )
    return min(min_offset, end)


def resolve_ranges(
    states: Iterable[QueueState], starting: OffsetSpec, ending: OffsetSpec, *, fail_on_data_loss: bool
) -> list[Range]:
    """One `[start, end)` per queue for a batch read; ends are clamped to the confirmed offset."""
    out = []
    states = list(states)
    known = {s.qid for s in states}
    for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        missing = sorted(set(spec.explicit) - known)
        if missing:
            raise InvalidArgumentError(
                f"{name} names queues the topics do not have: {offsets_to_json(dict.fromkeys(missing, 0))}"
            )
    for s in sorted(states, key=lambda s: s.qid):
        where = f"{s.topic} {queue_name(s.broker_set, s.queue)}"
        want_end = ending.for_queue(s.qid)
        end = s.confirmed if want_end in (LATEST, EARLIEST) else want_end
        if want_end == EARLIEST:
            end = s.min
        if end > s.confirmed:
            log.warning(
                "%s: endingOffsets %d is past the confirmed offset %d; reading to %d",
                where,
                end,
                s.confirmed,
                s.confirmed,
            )
            end = s.confirmed
        want_start = starting.for_queue(s.qid)
        if want_start == EARLIEST:
            start = s.min
        elif want_start == LATEST:
            start = s.confirmed
        else:
            start = want_start
        if start > end:
            raise InvalidArgumentError(
                f"{where}: startingOffsets {start} is after the end {end} (confirmed offset {s.confirmed})"
            )
        start = check_start(start, s.min, end, fail_on_data_loss=fail_on_data_loss, where=where)
        out.append(Range(s.topic, s.broker_set, s.queue, start, end))
    return out


def split_range(start: int, end: int, max_size: int) -> list[tuple[int, int]]:
    """Cut `[start, end)` into the fewest pieces of at most `max_size`, their sizes within one of each other."""
    if max_size < 1:
        raise ValueError("max_size must be positive")
    if end <= start:
        return []
    n = math.ceil((end - start) / max_size)
    size, extra = divmod(end - start, n)
    out = []
    pos = start
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append((pos, pos + step))
        pos += step
    return out


def split_ranges(ranges: Iterable[Range], max_size: int) -> list[Range]:
    """Spark partitions for the ranges: empty ranges dropped, big ones split."""
    return [
        Range(r.topic, r.broker_set, r.queue, a, b, r.earliest)
        for r in ranges
        for a, b in split_range(r.start, r.end, max_size)
    ]


# --- streaming -----------------------------------------------------------------------------


def next_offsets(start: Mapping[QueueId, int], states: Iterable[QueueState]) -> tuple[Offsets, Offsets]:
    """`(from, latest)` for the next micro-batch: where each queue stands and its newest readable end.

    `latest` never moves a queue backwards. A queue the query has not seen yet (a topic grew)
    stands at its minimum offset in `from`; queues the cluster no longer reports keep their place.
    """
    current = dict(start)
    latest = dict(start)
    for s in states:
        here = start.get(s.qid, s.min)
        current[s.qid] = here
        latest[s.qid] = max(here, s.confirmed)
    return current, latest


def budget(start: Mapping[QueueId, int], latest: Mapping[QueueId, int], limit: int | None) -> Offsets:
    """Ends for the next micro-batch that read at most `limit` offsets in all.

    `start` must name every queue of `latest`. Queues get shares in proportion to their backlog
    (largest remainder, ties by queue id), so the result is deterministic and takes exactly
    `min(limit, backlog)` offsets: a small limit over many queues still makes progress.
    """
    ends = {q: max(start[q], off) for q, off in latest.items()}
    lags = {q: ends[q] - start[q] for q in ends}
    total = sum(lags.values())
    if limit is None or total <= limit:
        return ends
    if limit < 0:
        raise ValueError("limit must not be negative")
    shares = {}
    remainders = []
    for q in sorted(lags):
        # Integer arithmetic: offsets go up to 2**63 and floats would round shares past a backlog.
        share, rest = divmod(lags[q] * limit, total)
        shares[q] = share
        remainders.append((-rest, q))
    left = limit - sum(shares.values())
    for _, q in sorted(remainders)[:left]:
        shares[q] += 1
    return {q: start[q] + shares[q] for q in ends}


def stream_ranges(start: Mapping[QueueId, int], end: Mapping[QueueId, int]) -> list[Range]:
    """The non-empty ranges between two checkpointed offset maps.

    A queue missing from `start` appeared after the previous batch was planned: it is read from
    its beginning (`earliest`), so what retention deleted there is skipped without being called
    data loss.
    """
    out = []
    for qid, e in sorted(end.items()):
        s = start.get(qid)
        if s is None:
            if e > 0:
                out.append(Range(qid[0], qid[1], qid[2], 0, e, earliest=True))
        elif e > s:
            out.append(Range(qid[0], qid[1], qid[2], s, e))
    return out
