from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProduceMessage(_message.Message):
    __slots__ = ("body", "key", "tags", "properties", "queue")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BODY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    key: str
    tags: str
    properties: _containers.ScalarMap[str, str]
    queue: int
    def __init__(self, body: _Optional[bytes] = ..., key: _Optional[str] = ..., tags: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., queue: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("topic", "messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: _containers.RepeatedCompositeFieldContainer[ProduceMessage]
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ProduceMessage, _Mapping]]] = ...) -> None: ...

class ProduceResult(_message.Message):
    __slots__ = ("queue", "queue_offset", "phys_offset", "message_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PHYS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    queue: int
    queue_offset: int
    phys_offset: int
    message_id: str
    def __init__(self, queue: _Optional[int] = ..., queue_offset: _Optional[int] = ..., phys_offset: _Optional[int] = ..., message_id: _Optional[str] = ...) -> None: ...

class ProduceReply(_message.Message):
    __slots__ = ("broker_set", "results")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    results: _containers.RepeatedCompositeFieldContainer[ProduceResult]
    def __init__(self, broker_set: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ProduceResult, _Mapping]]] = ...) -> None: ...

class ProduceBatchRequest(_message.Message):
    __slots__ = ("topic", "queue", "records", "count", "crc")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    records: bytes
    count: int
    crc: int
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ..., records: _Optional[bytes] = ..., count: _Optional[int] = ..., crc: _Optional[int] = ...) -> None: ...

class ProduceBatchReply(_message.Message):
    __slots__ = ("broker_set", "queue", "first_queue_offset", "phys_offsets")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FIRST_QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PHYS_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    queue: int
    first_queue_offset: int
    phys_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_set: _Optional[str] = ..., queue: _Optional[int] = ..., first_queue_offset: _Optional[int] = ..., phys_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class QueueOffsets(_message.Message):
    __slots__ = ("min", "max", "confirmed")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    min: int
    max: int
    confirmed: int
    def __init__(self, min: _Optional[int] = ..., max: _Optional[int] = ..., confirmed: _Optional[int] = ...) -> None: ...

class PulledMessage(_message.Message):
    __slots__ = ("topic", "queue", "offset", "key", "tags", "properties", "body", "born_ts", "store_ts", "phys_offset")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BORN_TS_FIELD_NUMBER: _ClassVar[int]
    STORE_TS_FIELD_NUMBER: _ClassVar[int]
    PHYS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    offset: int
    key: str
    tags: str
    properties: _containers.ScalarMap[str, str]
    body: bytes
    born_ts: int
    store_ts: int
    phys_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ..., offset: _Optional[int] = ..., key: _Optional[str] = ..., tags: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., born_ts: _Optional[int] = ..., store_ts: _Optional[int] = ..., phys_offset: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue", "offset", "max_messages", "max_bytes", "wait_ms", "encoded")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    offset: int
    max_messages: int
    max_bytes: int
    wait_ms: int
    encoded: bool
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., encoded: _Optional[bool] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("messages", "next_offset", "offsets", "records", "count", "crc")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PulledMessage]
    next_offset: int
    offsets: QueueOffsets
    records: bytes
    count: int
    crc: int
    def __init__(self, messages: _Optional[_Iterable[_Union[PulledMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., offsets: _Optional[_Union[QueueOffsets, _Mapping]] = ..., records: _Optional[bytes] = ..., count: _Optional[int] = ..., crc: _Optional[int] = ...) -> None: ...

class GetOffsetsRequest(_message.Message):
    __slots__ = ("topic", "queue")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ...) -> None: ...

class GetOffsetsReply(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: QueueOffsets
    def __init__(self, offsets: _Optional[_Union[QueueOffsets, _Mapping]] = ...) -> None: ...

class CommitOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("commits",)
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    commits: _containers.RepeatedCompositeFieldContainer[CommitOffsetRequest]
    def __init__(self, commits: _Optional[_Iterable[_Union[CommitOffsetRequest, _Mapping]]] = ...) -> None: ...

class CommitOffsetsReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue: _Optional[int] = ...) -> None: ...

class FetchOffsetReply(_message.Message):
    __slots__ = ("found", "offset")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    offset: int
    def __init__(self, found: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class SearchOffsetRequest(_message.Message):
    __slots__ = ("topic", "queue", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class SearchOffsetReply(_message.Message):
    __slots__ = ("offset", "offsets")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    offsets: QueueOffsets
    def __init__(self, offset: _Optional[int] = ..., offsets: _Optional[_Union[QueueOffsets, _Mapping]] = ...) -> None: ...

class GroupOffset(_message.Message):
    __slots__ = ("topic", "queue", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListGroupOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class ListGroupOffsetsReply(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[GroupOffset, _Mapping]]] = ...) -> None: ...

class DeleteGroupOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class DeleteGroupOffsetsReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedCompositeFieldContainer[GroupOffset]
    def __init__(self, deleted: _Optional[_Iterable[_Union[GroupOffset, _Mapping]]] = ...) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("topic", "queue", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class GetMessageByIdRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class FindMessagesRequest(_message.Message):
    __slots__ = ("topic", "key", "begin_ts", "end_ts", "max_messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TS_FIELD_NUMBER: _ClassVar[int]
    END_TS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    begin_ts: int
    end_ts: int
    max_messages: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., begin_ts: _Optional[int] = ..., end_ts: _Optional[int] = ..., max_messages: _Optional[int] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("broker_set", "records", "count", "crc", "more")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    records: bytes
    count: int
    crc: int
    more: bool
    def __init__(self, broker_set: _Optional[str] = ..., records: _Optional[bytes] = ..., count: _Optional[int] = ..., crc: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaProgress(_message.Message):
    __slots__ = ("broker_id", "ack_offset", "connected", "in_sync")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    ack_offset: int
    connected: bool
    in_sync: bool
    def __init__(self, broker_id: _Optional[int] = ..., ack_offset: _Optional[int] = ..., connected: _Optional[bool] = ..., in_sync: _Optional[bool] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("broker_set", "broker_id", "role", "master_epoch", "last_epoch", "min_offset", "max_offset", "confirm_offset", "flushed_offset", "sync_state_set", "sync_state_set_epoch", "master_address", "replicas", "pending_sync_state_set", "data_address", "rocketmq_address", "controller_heard_ms_ago")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PENDING_SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROCKETMQ_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_HEARD_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    broker_id: int
    role: str
    master_epoch: int
    last_epoch: int
    min_offset: int
    max_offset: int
    confirm_offset: int
    flushed_offset: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    master_address: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaProgress]
    pending_sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    data_address: str
    rocketmq_address: str
    controller_heard_ms_ago: int
    def __init__(self, broker_set: _Optional[str] = ..., broker_id: _Optional[int] = ..., role: _Optional[str] = ..., master_epoch: _Optional[int] = ..., last_epoch: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ..., flushed_offset: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., master_address: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaProgress, _Mapping]]] = ..., pending_sync_state_set: _Optional[_Iterable[int]] = ..., data_address: _Optional[str] = ..., rocketmq_address: _Optional[str] = ..., controller_heard_ms_ago: _Optional[int] = ...) -> None: ...

class SharedReceiveRequest(_message.Message):
    __slots__ = ("group", "topic", "queue", "max_messages", "invisible_ms", "max_attempts", "start_latest", "wait_ms", "key_ordered")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    START_LATEST_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_ORDERED_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue: int
    max_messages: int
    invisible_ms: int
    max_attempts: int
    start_latest: bool
    wait_ms: int
    key_ordered: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue: _Optional[int] = ..., max_messages: _Optional[int] = ..., invisible_ms: _Optional[int] = ..., max_attempts: _Optional[int] = ..., start_latest: _Optional[bool] = ..., wait_ms: _Optional[int] = ..., key_ordered: _Optional[bool] = ...) -> None: ...

class SharedReceiveReply(_message.Message):
    __slots__ = ("records", "count", "crc", "receipts", "attempts")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    records: bytes
    count: int
    crc: int
    receipts: _containers.RepeatedScalarFieldContainer[str]
    attempts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, records: _Optional[bytes] = ..., count: _Optional[int] = ..., crc: _Optional[int] = ..., receipts: _Optional[_Iterable[str]] = ..., attempts: _Optional[_Iterable[int]] = ...) -> None: ...

class SharedAckRequest(_message.Message):
    __slots__ = ("group", "topic", "queue", "receipts")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue: int
    receipts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue: _Optional[int] = ..., receipts: _Optional[_Iterable[str]] = ...) -> None: ...

class SharedAckReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SharedChangeInvisibleRequest(_message.Message):
    __slots__ = ("group", "topic", "queue", "receipts", "invisible_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue: int
    receipts: _containers.RepeatedScalarFieldContainer[str]
    invisible_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue: _Optional[int] = ..., receipts: _Optional[_Iterable[str]] = ..., invisible_ms: _Optional[int] = ...) -> None: ...

class SharedChangeInvisibleReply(_message.Message):
    __slots__ = ("receipts",)
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    receipts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, receipts: _Optional[_Iterable[str]] = ...) -> None: ...

class SharedDeadLetterRequest(_message.Message):
    __slots__ = ("group", "topic", "queue", "receipt")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue: int
    receipt: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue: _Optional[int] = ..., receipt: _Optional[str] = ...) -> None: ...

class SharedDeadLetterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
