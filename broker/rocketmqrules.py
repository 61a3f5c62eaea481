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
- Delayed and transactional messages (broker/rocketmqtx.py): a message kept in an internal
  topic until it is due or committed carries where it goes (`rmq.target_topic`,
  `rmq.target_queue`) and, for a delay, when (`rmq.deliver_at`); its copy in its topic carries
  where it was kept (`rmq.origin`, the key of the look-back that keeps a copy from being made
  twice) and the message id its producer was given (`rmq.origin_id`). A transaction id is
  `<broker set>:tx:<offset of the half message>`.
- Recall handles: a delayed message's `<broker set>:recall:<bucket>:<offset in %DELAY%>`, which
  RecallMessage names to drop it before it is due.
- Routes: every queue of a route names the endpoint(s) the client asked through (its access
  point, `route_addresses`), as RocketMQ's proxy does in cluster mode: any endpoint serves every
  queue of the cluster.
- Body digests: the CRC32 of a body written as the calling client compares it (`crc32_checksum`).
- Group members: the member id a RocketMQ consumer is announced under (`member_id`).
- Signatures: with access keys configured, a request must carry the official clients'
  `MQv2-HMAC-SHA1` signature by one of them (`refusal`).
- Permissions: with auth on, a user of the controller's table may make a call only with the
  permissions `METHODS` names for it (tidelog/acl.py's kinds and rules; `permission_refusal`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog import access, acl

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
    "RPO_BOUND_REACHED": "SLAVE_PERSISTENCE_TIMEOUT",
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
PROP_TARGET_TOPIC = "rmq.target_topic"
PROP_TARGET_QUEUE = "rmq.target_queue"
PROP_DELIVER_AT = "rmq.deliver_at"  # ms since the epoch
PROP_ORIGIN = "rmq.origin"  # "<internal topic>/<queue>/<offset>" of the kept message
PROP_ORIGIN_ID = "rmq.origin_id"  # the message id the producer was given for it
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


# --- body digests ------------------------------------------------------------------------------

#: The `x-mq-language` the official Node.js client sends (its every call says "HTTP").
NODE_JS_LANGUAGE = "HTTP"


def crc32_checksum(body: bytes, language: str) -> str:
    """A received message's CRC32 body digest as the calling client checks it, which the official
    clients write differently: the Node.js client compares the decimal number, the others (the
    Python client among them) eight upper-case hex digits. A client that finds another form marks
    the message corrupted (the Node.js push consumer then drops it unconsumed)."""
    value = zlib.crc32(body) & 0xFFFFFFFF
    return str(value) if language == NODE_JS_LANGUAGE else format(value, "08X")


# --- transaction ids ---------------------------------------------------------------------------

_TRANSACTION_ID = re.compile(r"(?P<set>[A-Za-z0-9][A-Za-z0-9._-]{0,126}):tx:(?P<offset>[0-9a-f]{1,16})")


def encode_transaction_id(broker_set: str, offset: int) -> str:
    return f"{broker_set}:tx:{offset:x}"


def decode_transaction_id(text: str) -> tuple[str, int] | None:
    """(broker set, half-message offset) of a transaction id this endpoint gave, else None."""
    m = _TRANSACTION_ID.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    return m.group("set"), int(m.group("offset"), 16)


# --- recall handles ----------------------------------------------------------------------------

_RECALL_HANDLE = re.compile(
    r"(?P<set>[A-Za-z0-9][A-Za-z0-9._-]{0,126}):recall:(?P<bucket>\d{1,2}):(?P<offset>[0-9a-f]{1,16})"
)


@dataclass(frozen=True)
class RecallHandle:
    broker_set: str
    bucket: int  # the queue of %DELAY% that keeps the message
    offset: int  # its offset there


def encode_recall_handle(broker_set: str, bucket: int, offset: int) -> str:
    return f"{broker_set}:recall:{bucket}:{offset:x}"


def decode_recall_handle(text: str) -> RecallHandle | None:
    """The parts of a recall handle this cluster gave, else None."""
    m = _RECALL_HANDLE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    return RecallHandle(m.group("set"), int(m.group("bucket")), int(m.group("offset"), 16))


# --- routes ------------------------------------------------------------------------------------


def route_addresses(asked_through: Sequence[tuple[str, int]], own: str) -> list[str]:
    """The addresses every queue of a route names: those the client asked through (its access
    point: one, or several for failover), else this endpoint's own `own`. The client keeps
    talking to what it was configured with, whose certificate names what it dialled, and each
    endpoint passes a call on to the master of the queue's broker set."""
    found = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in asked_through if h and 0 < p < 65536]
    return list(dict.fromkeys(found)) or [own]


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
# The scheme (MQv2-HMAC-SHA1 over x-mq-date-time) is parsed and checked in tidelog/access.py, the
# one checker every port shares; here only what "no access keys configured" means for this endpoint.

ALGORITHM = access.ALGORITHM
AUTHORIZATION = access.AUTHORIZATION
DEFAULT_MAX_SKEW_S = access.DEFAULT_MAX_SKEW_S
sign = access.sign
parse_authorization = access.parse_authorization
date_time_s = access.date_time_s


def refusal(
    headers: Mapping[str, str],
    secrets: Mapping[str, str],
    now_s: float,
    max_skew_s: int,
    users: Callable[[str], str | None] | None = None,
) -> str | None:
    """Why a call with these metadata `headers` (lower-case names) is refused, or None if it is
    signed by one of `secrets` (access key -> secret key) or a user of the controller's table
    (`users`: access key -> signing key) with a date-time at most `max_skew_s` from `now_s` (0:
    the time is not checked). With neither, there is no authentication and every call passes."""
    if not secrets and users is None:
        return None

    def key_of(access_key: str) -> str | None:
        found = secrets.get(access_key)
        return found if found is not None or users is None else users(access_key)

    verdict = access.check(headers, key_of, now_s, max_skew_s)
    if verdict.refusal == access.NO_MATCH:
        return "the signature does not match a configured access key"
    return verdict.refusal


# --- permissions ---------------------------------------------------------------------------------
#
# What a user of the controller's table needs for each MessagingService call, from its request, as
# tidelog/acl.py's METHODS does for tidelog's own services. Access keys of `rocketmq_access_keys`
# are the operator's own and are not checked against grants.


def _topic(*permissions: str) -> Callable[[Any], list[acl.Check]]:
    return lambda r: [acl.Check(permissions, acl.TOPIC, r.topic.name)]


def _queue_topic(r: Any) -> list[acl.Check]:
    return [acl.Check(("consume",), acl.TOPIC, r.message_queue.topic.name)]


def _group(r: Any) -> list[acl.Check]:
    return [acl.Check(("consume",), acl.GROUP, r.group.name)]


def _and(*rules: Callable[[Any], list[acl.Check]]) -> Callable[[Any], list[acl.Check]]:
    return lambda r: [c for rule in rules for c in rule(r)]


def _sent(r: Any) -> list[acl.Check]:
    return [acl.Check(("produce",), acl.TOPIC, name) for name in sorted({m.topic.name for m in r.messages})]


def _nothing(r: Any) -> list[acl.Check]:
    """A signature is enough: the client's liveness and settings, no topic or group of anyone's."""
    return []


_CONSUMING = _and(_group, _topic("consume"))

#: MessagingService method name -> the checks a call needs.
METHODS: dict[str, Callable[[Any], list[acl.Check]]] = {
    "QueryRoute": _topic("produce", "consume"),
    "Heartbeat": _nothing,
    "SendMessage": _sent,
    "QueryAssignment": _CONSUMING,
    "ReceiveMessage": _and(_group, _queue_topic),
    "AckMessage": _CONSUMING,
    "ForwardMessageToDeadLetterQueue": _CONSUMING,
    "PullMessage": _and(_group, _queue_topic),
    "UpdateOffset": _and(_group, _queue_topic),
    "GetOffset": _and(_group, _queue_topic),
    "QueryOffset": _queue_topic,
    "EndTransaction": _topic("produce"),
    "Telemetry": _nothing,
    "NotifyClientTermination": _nothing,
    "ChangeInvisibleDuration": _CONSUMING,
    "RecallMessage": _topic("produce"),
    "SyncLiteSubscription": _CONSUMING,
}


def permission_refusal(user: str, table: acl.AclState, method: str, request: Any) -> str | None:
    """Why user `user` may not make this MessagingService call (None: it may). A method missing
    from METHODS is refused; a streamed request (`request` None) passes only with no checks."""
    rule = METHODS.get(method)
    if rule is None or (request is None and rule is not _nothing):
        return f"{method} is not open to users"
    return acl.satisfied(user, table, rule(request))
