"""The rules of the RocketMQ endpoint (broker/rocketmq.py), apart from its I/O (pure).

- Status codes: which RocketMQ `Code` (by name, as in apache.rocketmq.v2's definition.proto)
  answers each tidelog error code, chosen for what the official clients then do: a producer
  retries a send on its next queue for every code but TOO_MANY_REQUESTS, so the "try again"
  errors (NOT_MASTER, IN_SYNC_REPLICAS_NOT_ENOUGH, a flush timeout) map to server-side codes, and
  caller mistakes to the 400 family, which the clients raise at once.
- Receipt handles: RocketMQ's `receipt_handle` string carries what tidelog's SharedAck needs,
  `<broker set>:<queue>:<shared-mode receipt>` (the topic travels in the request itself).
- Tag filters: `*` (or nothing) matches every message, `a||b` the messages tagged a or b.
- Message properties: a RocketMQ message stored as a tidelog message keeps its RocketMQ fields
  as properties under `rmq.` (the client's message id, its keys, its message group, its type);
  tidelog's own key is the message group of a FIFO message (so a group always lands on one
  queue, in order) and otherwise the first RocketMQ key (so `find_messages` finds it).
- Group members: the member id a RocketMQ consumer is announced under (`member_id`).
- Signatures: with access keys configured, a request must carry the official clients'
  `MQv2-HMAC-SHA1` signature by one of them (`refusal`).
"""

from __future__ import annotations

import calendar
import hmac
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha1

#: tidelog error code -> RocketMQ Code name.
CODE_FOR_ERROR: dict[str, str] = {
    "INVALID_ARGUMENT": "BAD_REQUEST",
    "CONFIG_INVALID": "BAD_REQUEST",
    "TOPIC_EXISTS": "BAD_REQUEST",
    "TOPIC_NOT_FOUND": "TOPIC_NOT_FOUND",
    "CONTROLLER_BROKER_METADATA_NOT_EXIST": "NOT_FOUND",
    "GROUP_NOT_FOUND": "CONSUMER_GROUP_NOT_FOUND",
    "SUBSCRIPTION_CONFLICT": "ILLEGAL_CONSUMER_GROUP",
    "MESSAGE_NOT_FOUND": "MESSAGE_NOT_FOUND",
    "MESSAGE_ILLEGAL": "MESSAGE_BODY_TOO_LARGE",
    "RECEIPT_INVALID": "INVALID_RECEIPT_HANDLE",
    "UNAUTHENTICATED": "UNAUTHORIZED",
    "LEDGER_UNAUTHORIZED": "FORBIDDEN",
    "CORRUPT_RECORD": "MESSAGE_CORRUPTED",
    # the set has no master here (now): the client retries on its next queue while tidelog's
    # route moves to the new master
    "NOT_MASTER": "HA_NOT_AVAILABLE",
    "IN_SYNC_REPLICAS_NOT_ENOUGH": "HA_NOT_AVAILABLE",
    "SLAVE_NOT_AVAILABLE": "HA_NOT_AVAILABLE",
    "CONTROLLER_MASTER_NOT_AVAILABLE": "HA_NOT_AVAILABLE",
    "FLUSH_DISK_TIMEOUT": "MASTER_PERSISTENCE_TIMEOUT",
    "FLUSH_SLAVE_TIMEOUT": "SLAVE_PERSISTENCE_TIMEOUT",
    "LEDGER_TIMEOUT": "PROXY_TIMEOUT",
}
#: Codes for what is not a tidelog error.
OK = "OK"
NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
UNSUPPORTED = "UNSUPPORTED"
TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"
TIMEOUT = "PROXY_TIMEOUT"
RETRY_LATER = "INTERNAL_SERVER_ERROR"  # any other retryable error: the clients retry sends on it
INTERNAL = "INTERNAL_ERROR"


def code_for(tidelog_code: str, retryable: bool) -> str:
    """The RocketMQ Code name answering a tidelog error of `tidelog_code`."""
    found = CODE_FOR_ERROR.get(tidelog_code)
    if found is not None:
        return found
    return RETRY_LATER if retryable else INTERNAL


# --- receipt handles ---------------------------------------------------------------------------

_HANDLE = re.compile(
    r"(?P<set>[A-Za-z0-9][A-Za-z0-9._-]{0,126}):(?P<queue>\d{1,9}):(?P<receipt>[0-9a-f.]{5,80})"
)


@dataclass(frozen=True)
class Handle:
    broker_set: str
    queue: int
    receipt: str  # the shared mode's receipt (broker/sharedstate.py)


def encode_handle(broker_set: str, queue: int, receipt: str) -> str:
    return f"{broker_set}:{queue}:{receipt}"


def decode_handle(text: str) -> Handle | None:
    """The parts of a receipt handle this endpoint gave, or None for anything else."""
    m = _HANDLE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    return Handle(m.group("set"), int(m.group("queue")), m.group("receipt"))


# --- tag filters -------------------------------------------------------------------------------

MAX_TAG_FILTER = 4096


def parse_tag_filter(expression: str) -> frozenset[str] | None:
    """The tags an expression accepts (None: all); ValueError for an expression it cannot be."""
    text = expression.strip()
    if text in ("", "*"):
        return None
    if len(text) > MAX_TAG_FILTER:
        raise ValueError(f"a tag expression is at most {MAX_TAG_FILTER} characters")
    tags = [t.strip() for t in text.split("||")]
    if any(not t for t in tags):
        raise ValueError(f"tag expression {expression[:100]!r} has an empty tag (write a||b)")
    if "*" in tags:
        return None
    return frozenset(tags)


def tag_matches(accepted: frozenset[str] | None, tag: str | None) -> bool:
    return accepted is None or (tag is not None and tag in accepted)


# --- message properties ------------------------------------------------------------------------

PROP_MESSAGE_ID = "rmq.message_id"
PROP_KEYS = "rmq.keys"  # the RocketMQ keys, joined by KEY_SEPARATOR as RocketMQ's KEYS property
PROP_GROUP = "rmq.message_group"
PROP_TYPE = "rmq.message_type"
PROP_BORN_HOST = "rmq.born_host"
RESERVED_PREFIX = "rmq."
KEY_SEPARATOR = " "
MAX_KEYS = 32


@dataclass(frozen=True)
class Stored:
    """How a RocketMQ message is stored: tidelog's key, tags and properties."""

    key: str | None
    tags: str | None
    properties: dict[str, str]


def to_stored(
    *,
    message_id: str,
    message_type: str,
    tag: str,
    keys: Sequence[str],
    message_group: str,
    born_host: str,
    user_properties: Mapping[str, str],
) -> Stored:
    """The stored form of a RocketMQ message; ValueError naming what is wrong with one."""
    if any(k.startswith(RESERVED_PREFIX) for k in user_properties):
        raise ValueError(f"property names starting with {RESERVED_PREFIX!r} are reserved")
    if len(keys) > MAX_KEYS or any(not k or KEY_SEPARATOR in k for k in keys):
        raise ValueError(f"at most {MAX_KEYS} keys, each non-empty and without spaces")
    if "||" in tag or tag.strip() != tag:
        raise ValueError("a tag contains no '||' and no leading or trailing space")
    props = dict(user_properties)
    props[PROP_TYPE] = message_type
    if message_id:
        props[PROP_MESSAGE_ID] = message_id
    if keys:
        props[PROP_KEYS] = KEY_SEPARATOR.join(keys)
    if message_group:
        props[PROP_GROUP] = message_group
    if born_host:
        props[PROP_BORN_HOST] = born_host
    key = message_group or (keys[0] if keys else None)
    return Stored(key, tag or None, props)


@dataclass(frozen=True)
class Loaded:
    """A stored message's RocketMQ fields."""

    user_properties: dict[str, str]
    keys: list[str]
    message_group: str
    message_type: str
    client_message_id: str
    born_host: str


def from_stored(key: str | None, properties: Mapping[str, str]) -> Loaded:
    """The RocketMQ fields of a stored message (one tidelog's own client sent too: its key is
    then the message's one RocketMQ key)."""
    user = {k: v for k, v in properties.items() if not k.startswith(RESERVED_PREFIX)}
    if PROP_TYPE in properties:
        keys = [k for k in properties.get(PROP_KEYS, "").split(KEY_SEPARATOR) if k]
    else:
        keys = [key] if key else []
    return Loaded(
        user,
        keys,
        properties.get(PROP_GROUP, ""),
        properties.get(PROP_TYPE, "NORMAL"),
        properties.get(PROP_MESSAGE_ID, ""),
        properties.get(PROP_BORN_HOST, ""),
    )


# --- group members -----------------------------------------------------------------------------


def member_id(client_id: str, topic: str) -> str:
    """The member id under which RocketMQ consumer `client_id` (`host@pid@index@time`) reading
    `topic` is announced in its group (broker/rocketmqmembers.py): a segment of a metadata key,
    so no '/' (nor the '@' that names a broadcast member's state), one per topic."""
    safe = "".join(c if c.isalnum() or c in "._-" else "." for c in client_id[:200])
    return f"rmq.{safe}.{topic}"


# --- bounds of a request -----------------------------------------------------------------------

DEFAULT_LONG_POLL_MS = 20_000
MAX_LONG_POLL_MS = 60_000
DEFAULT_INVISIBLE_MS = 30_000


def long_poll_ms(requested_ms: int, remaining_ms: int | None) -> int:
    """How long a receive waits: what the client asked (its default otherwise), at most
    MAX_LONG_POLL_MS, and ending a little before the client's own deadline."""
    wait = requested_ms if requested_ms > 0 else DEFAULT_LONG_POLL_MS
    wait = min(wait, MAX_LONG_POLL_MS)
    if remaining_ms is not None:
        # answer while the client still listens: its deadline is its request timeout + this wait
        wait = min(wait, max(0, remaining_ms - 1000))
    return max(0, wait)


# --- signatures --------------------------------------------------------------------------------
#
# The official clients (Java, Go, Python, ...) sign every call with two metadata entries:
#   x-mq-date-time: 20261126T171138Z                                 (yyyyMMdd'T'HHmmss'Z')
#   authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
#                   Signature=<hex of HMAC-SHA1(secret key, the x-mq-date-time value)>
# The Java client writes the hex in upper case, the Python client in lower case: the signature
# is compared as the 20 bytes it encodes. Only the date-time is signed, so a captured signature
# can be replayed: the clock check bounds for how long, and TLS keeps it from being captured.

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
DEFAULT_MAX_SKEW_S = 900  # 15 minutes either way, RocketMQ's and the cloud signers' usual bound
_DATE_TIME = re.compile(r"\d{8}T\d{6}Z")
_SIGNATURE = re.compile(r"[0-9A-Fa-f]{40}")


def sign(secret_key: str, date_time: str) -> str:
    """The signature of `date_time` by `secret_key`, as the clients write it (lower-case hex)."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


def parse_authorization(value: str) -> tuple[str, list[str], str] | None:
    """(access key, signed headers, signature) of an `authorization` value, or None if it is not
    an `MQv2-HMAC-SHA1` one. A credential `ak/scope...` names access key `ak`, as RocketMQ reads it."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, field_value = part.strip().partition("=")
        if not eq or name in fields:
            return None
        fields[name] = field_value.strip()
    if not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
        return None
    access_key = fields["Credential"].split("/", 1)[0]
    signed = [h.strip().lower() for h in fields["SignedHeaders"].split(";") if h.strip()]
    return access_key, signed, fields["Signature"]


def date_time_s(text: str) -> int | None:
    """The seconds since the epoch of a `yyyyMMdd'T'HHmmss'Z'` date-time (UTC), None if it is not one."""
    if not _DATE_TIME.fullmatch(text):
        return None
    try:
        return calendar.timegm(time.strptime(text, "%Y%m%dT%H%M%SZ"))
    except ValueError:  # a month 13, a day 32
        return None


def refusal(
    headers: Mapping[str, str], secrets: Mapping[str, str], now_s: float, max_skew_s: int
) -> str | None:
    """Why a call with these metadata `headers` (lower-case names) is refused, or None if it is
    signed by one of `secrets` (access key -> secret key; empty: no authentication, every call
    passes) with a date-time at most `max_skew_s` from `now_s` (0: the time is not checked).

    An unknown access key and a wrong signature get the same answer: a caller learns nothing of
    which access keys exist."""
    if not secrets:
        return None
    value = headers.get(AUTHORIZATION)
    if value is None:
        return f"this endpoint needs {ALGORITHM} signed calls: configure the client's credentials"
    parsed = parse_authorization(value)
    if parsed is None:
        return f"the authorization is not {ALGORITHM} Credential=..., SignedHeaders=..., Signature=..."
    access_key, signed, signature = parsed
    if DATE_TIME not in signed:
        return f"the signature must cover {DATE_TIME}"
    date_time = headers.get(DATE_TIME, "")
    at = date_time_s(date_time)
    if at is None:
        return f"{DATE_TIME} {date_time[:40]!r} is not a yyyyMMddTHHmmssZ date-time"
    if max_skew_s and abs(at - now_s) > max_skew_s:
        return (
            f"{DATE_TIME} {date_time} is more than {max_skew_s} s from the broker's time "
            "(the clients write their local time: run them with a correct clock, in UTC)"
        )
    secret = secrets.get(access_key)
    expected = sign(secret if secret is not None else "", date_time)
    # compared in constant time, and for an unknown key too, so timing tells nothing either
    given = bytes.fromhex(signature) if _SIGNATURE.fullmatch(signature) else b""
    if not hmac.compare_digest(bytes.fromhex(expected), given) or secret is None:
        return "the signature does not match a configured access key"
    return None
