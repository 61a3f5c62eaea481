from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateRequest(_message.Message):
    __slots__ = ("ledger_id", "metadata")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    metadata: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class CreateReply(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    def __init__(self, broker_id: _Optional[int] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "password", "lac", "length", "digest", "data", "recovery")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    password: bytes
    lac: int
    length: int
    digest: bytes
    data: bytes
    recovery: bool
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., password: _Optional[bytes] = ..., lac: _Optional[int] = ..., length: _Optional[int] = ..., digest: _Optional[bytes] = ..., data: _Optional[bytes] = ..., recovery: _Optional[bool] = ...) -> None: ...

class AddBatchRequest(_message.Message):
    __slots__ = ("ledger_id", "password", "entries")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    password: bytes
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, ledger_id: _Optional[int] = ..., password: _Optional[bytes] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class AddBatchReply(_message.Message):
    __slots__ = ("first_entry_id", "last_entry_id", "replicas", "broker_id")
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    first_entry_id: int
    last_entry_id: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    broker_id: int
    def __init__(self, first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., broker_id: _Optional[int] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("ledger_id", "password")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    password: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., password: _Optional[bytes] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ("last_entry_id", "length", "broker_id")
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    last_entry_id: int
    length: int
    broker_id: int
    def __init__(self, last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., broker_id: _Optional[int] = ...) -> None: ...

class AddReply(_message.Message):
    __slots__ = ("entry_id", "replicas", "broker_id")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    broker_id: int
    def __init__(self, entry_id: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., broker_id: _Optional[int] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("ledger_id", "password")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    password: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., password: _Optional[bytes] = ...) -> None: ...

class FenceReply(_message.Message):
    __slots__ = ("lac", "length", "broker_id")
    LAC_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    lac: int
    length: int
    broker_id: int
    def __init__(self, lac: _Optional[int] = ..., length: _Optional[int] = ..., broker_id: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "password", "first", "last", "fence", "max_bytes")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    password: bytes
    first: int
    last: int
    fence: bool
    max_bytes: int
    def __init__(self, ledger_id: _Optional[int] = ..., password: _Optional[bytes] = ..., first: _Optional[int] = ..., last: _Optional[int] = ..., fence: _Optional[bool] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("entry_id", "lac", "length", "digest", "data")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    lac: int
    length: int
    digest: bytes
    data: bytes
    def __init__(self, entry_id: _Optional[int] = ..., lac: _Optional[int] = ..., length: _Optional[int] = ..., digest: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReadReply(_message.Message):
    __slots__ = ("entries", "lac", "broker_id")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    lac: int
    broker_id: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., lac: _Optional[int] = ..., broker_id: _Optional[int] = ...) -> None: ...

class LacRequest(_message.Message):
    __slots__ = ("ledger_id", "password", "previous", "wait_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    password: bytes
    previous: int
    wait_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., password: _Optional[bytes] = ..., previous: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class LacReply(_message.Message):
    __slots__ = ("lac", "length", "fenced", "broker_id", "is_master")
    LAC_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    IS_MASTER_FIELD_NUMBER: _ClassVar[int]
    lac: int
    length: int
    fenced: bool
    broker_id: int
    is_master: bool
    def __init__(self, lac: _Optional[int] = ..., length: _Optional[int] = ..., fenced: _Optional[bool] = ..., broker_id: _Optional[int] = ..., is_master: _Optional[bool] = ...) -> None: ...
