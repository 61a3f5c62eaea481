from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoleAssignment(_message.Message):
    __slots__ = ("broker_set", "has_master", "master_id", "master_address", "master_ha_address", "master_epoch", "sync_state_set", "sync_state_set_epoch", "last_unclean_epoch")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    HAS_MASTER_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_HA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_UNCLEAN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    has_master: bool
    master_id: int
    master_address: str
    master_ha_address: str
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    last_unclean_epoch: int
    def __init__(self, broker_set: _Optional[str] = ..., has_master: _Optional[bool] = ..., master_id: _Optional[int] = ..., master_address: _Optional[str] = ..., master_ha_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., last_unclean_epoch: _Optional[int] = ...) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("broker_id", "address", "ha_address", "datacenter", "rack", "in_sync", "alive", "last_epoch", "last_max_offset", "is_master")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATACENTER_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IS_MASTER_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    address: str
    ha_address: str
    datacenter: str
    rack: str
    in_sync: bool
    alive: bool
    last_epoch: int
    last_max_offset: int
    is_master: bool
    def __init__(self, broker_id: _Optional[int] = ..., address: _Optional[str] = ..., ha_address: _Optional[str] = ..., datacenter: _Optional[str] = ..., rack: _Optional[str] = ..., in_sync: _Optional[bool] = ..., alive: _Optional[bool] = ..., last_epoch: _Optional[int] = ..., last_max_offset: _Optional[int] = ..., is_master: _Optional[bool] = ...) -> None: ...

class BrokerSetInfo(_message.Message):
    __slots__ = ("role", "members", "next_broker_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    role: RoleAssignment
    members: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    next_broker_id: int
    def __init__(self, role: _Optional[_Union[RoleAssignment, _Mapping]] = ..., members: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ..., next_broker_id: _Optional[int] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("name", "queues", "perm", "generation", "retention_ms")
    class QueuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    queues: _containers.ScalarMap[str, int]
    perm: str
    generation: int
    retention_ms: int
    def __init__(self, name: _Optional[str] = ..., queues: _Optional[_Mapping[str, int]] = ..., perm: _Optional[str] = ..., generation: _Optional[int] = ..., retention_ms: _Optional[int] = ...) -> None: ...

class MetaEntry(_message.Message):
    __slots__ = ("key", "value", "version")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    version: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("broker_set", "address", "ha_address", "datacenter", "rack", "identity", "broker_id", "cluster_id")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATACENTER_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    address: str
    ha_address: str
    datacenter: str
    rack: str
    identity: str
    broker_id: int
    cluster_id: str
    def __init__(self, broker_set: _Optional[str] = ..., address: _Optional[str] = ..., ha_address: _Optional[str] = ..., datacenter: _Optional[str] = ..., rack: _Optional[str] = ..., identity: _Optional[str] = ..., broker_id: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class RegisterBrokerReply(_message.Message):
    __slots__ = ("broker_id", "role", "cluster_id")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    role: RoleAssignment
    cluster_id: str
    def __init__(self, broker_id: _Optional[int] = ..., role: _Optional[_Union[RoleAssignment, _Mapping]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("broker_set", "broker_id", "epoch", "max_offset", "confirm_offset", "priority", "acl_version", "topics_version", "cluster_version")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPICS_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    broker_id: int
    epoch: int
    max_offset: int
    confirm_offset: int
    priority: int
    acl_version: int
    topics_version: str
    cluster_version: int
    def __init__(self, broker_set: _Optional[str] = ..., broker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ..., priority: _Optional[int] = ..., acl_version: _Optional[int] = ..., topics_version: _Optional[str] = ..., cluster_version: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("role", "topics", "heartbeat_interval_ms", "heartbeat_timeout_ms", "deleted_topics", "acl", "clean_elections_only", "topics_version", "topics_unchanged", "cluster", "lease_withheld", "rpo_bound_bytes", "ack_bound")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    DELETED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    ACL_FIELD_NUMBER: _ClassVar[int]
    CLEAN_ELECTIONS_ONLY_FIELD_NUMBER: _ClassVar[int]
    TOPICS_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPICS_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LEASE_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    RPO_BOUND_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACK_BOUND_FIELD_NUMBER: _ClassVar[int]
    role: RoleAssignment
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    deleted_topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    acl: AclTable
    clean_elections_only: bool
    topics_version: str
    topics_unchanged: bool
    cluster: ClusterView
    lease_withheld: bool
    rpo_bound_bytes: int
    ack_bound: int
    def __init__(self, role: _Optional[_Union[RoleAssignment, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ..., heartbeat_interval_ms: _Optional[int] = ..., heartbeat_timeout_ms: _Optional[int] = ..., deleted_topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ..., acl: _Optional[_Union[AclTable, _Mapping]] = ..., clean_elections_only: _Optional[bool] = ..., topics_version: _Optional[str] = ..., topics_unchanged: _Optional[bool] = ..., cluster: _Optional[_Union[ClusterView, _Mapping]] = ..., lease_withheld: _Optional[bool] = ..., rpo_bound_bytes: _Optional[int] = ..., ack_bound: _Optional[int] = ...) -> None: ...

class ClusterView(_message.Message):
    __slots__ = ("version", "broker_sets", "topics", "controllers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BROKER_SETS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLERS_FIELD_NUMBER: _ClassVar[int]
    version: int
    broker_sets: _containers.RepeatedCompositeFieldContainer[BrokerSetInfo]
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    controllers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., broker_sets: _Optional[_Iterable[_Union[BrokerSetInfo, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ..., controllers: _Optional[_Iterable[str]] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("name", "access_key", "signing_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    access_key: str
    signing_key: str
    def __init__(self, name: _Optional[str] = ..., access_key: _Optional[str] = ..., signing_key: _Optional[str] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("user", "kind", "pattern", "permission")
    USER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    user: str
    kind: str
    pattern: str
    permission: str
    def __init__(self, user: _Optional[str] = ..., kind: _Optional[str] = ..., pattern: _Optional[str] = ..., permission: _Optional[str] = ...) -> None: ...

class AclTable(_message.Message):
    __slots__ = ("version", "users", "grants")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    users: _containers.RepeatedCompositeFieldContainer[User]
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    def __init__(self, version: _Optional[int] = ..., users: _Optional[_Iterable[_Union[User, _Mapping]]] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ...) -> None: ...

class CreateUserRequest(_message.Message):
    __slots__ = ("name", "access_key", "signing_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    access_key: str
    signing_key: str
    def __init__(self, name: _Optional[str] = ..., access_key: _Optional[str] = ..., signing_key: _Optional[str] = ...) -> None: ...

class CreateUserReply(_message.Message):
    __slots__ = ("user", "not_yet_applied")
    USER_FIELD_NUMBER: _ClassVar[int]
    NOT_YET_APPLIED_FIELD_NUMBER: _ClassVar[int]
    user: User
    not_yet_applied: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., not_yet_applied: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteUserReply(_message.Message):
    __slots__ = ("not_yet_applied",)
    NOT_YET_APPLIED_FIELD_NUMBER: _ClassVar[int]
    not_yet_applied: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, not_yet_applied: _Optional[_Iterable[str]] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersReply(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class GrantAclRequest(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ...) -> None: ...

class GrantAclReply(_message.Message):
    __slots__ = ("not_yet_applied",)
    NOT_YET_APPLIED_FIELD_NUMBER: _ClassVar[int]
    not_yet_applied: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, not_yet_applied: _Optional[_Iterable[str]] = ...) -> None: ...

class RevokeAclRequest(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ...) -> None: ...

class RevokeAclReply(_message.Message):
    __slots__ = ("not_yet_applied",)
    NOT_YET_APPLIED_FIELD_NUMBER: _ClassVar[int]
    not_yet_applied: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, not_yet_applied: _Optional[_Iterable[str]] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: str
    def __init__(self, user: _Optional[str] = ...) -> None: ...

class ListAclsReply(_message.Message):
    __slots__ = ("grants",)
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    def __init__(self, grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ...) -> None: ...

class AlterSyncStateSetRequest(_message.Message):
    __slots__ = ("broker_set", "master_id", "master_epoch", "new_sync_state_set", "sync_state_set_epoch", "attempt")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    master_id: int
    master_epoch: int
    new_sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    attempt: int
    def __init__(self, broker_set: _Optional[str] = ..., master_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., new_sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class AlterSyncStateSetReply(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: RoleAssignment
    def __init__(self, role: _Optional[_Union[RoleAssignment, _Mapping]] = ...) -> None: ...

class ElectMasterRequest(_message.Message):
    __slots__ = ("broker_set", "broker_id", "designated", "restarted", "unclean", "restarted_epoch")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGNATED_FIELD_NUMBER: _ClassVar[int]
    RESTARTED_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_FIELD_NUMBER: _ClassVar[int]
    RESTARTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    broker_id: int
    designated: bool
    restarted: bool
    unclean: bool
    restarted_epoch: int
    def __init__(self, broker_set: _Optional[str] = ..., broker_id: _Optional[int] = ..., designated: _Optional[bool] = ..., restarted: _Optional[bool] = ..., unclean: _Optional[bool] = ..., restarted_epoch: _Optional[int] = ...) -> None: ...

class ElectMasterReply(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: RoleAssignment
    def __init__(self, role: _Optional[_Union[RoleAssignment, _Mapping]] = ...) -> None: ...

class GetRouteRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class BrokerSetRoute(_message.Message):
    __slots__ = ("broker_set", "queues", "role", "replicas")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    queues: int
    role: RoleAssignment
    replicas: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    def __init__(self, broker_set: _Optional[str] = ..., queues: _Optional[int] = ..., role: _Optional[_Union[RoleAssignment, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ...) -> None: ...

class GetRouteReply(_message.Message):
    __slots__ = ("topic", "perm", "broker_sets", "metadata_age_ms", "from_broker")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    BROKER_SETS_FIELD_NUMBER: _ClassVar[int]
    METADATA_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    perm: str
    broker_sets: _containers.RepeatedCompositeFieldContainer[BrokerSetRoute]
    metadata_age_ms: int
    from_broker: bool
    def __init__(self, topic: _Optional[str] = ..., perm: _Optional[str] = ..., broker_sets: _Optional[_Iterable[_Union[BrokerSetRoute, _Mapping]]] = ..., metadata_age_ms: _Optional[int] = ..., from_broker: _Optional[bool] = ...) -> None: ...

class DescribeBrokerSetsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeBrokerSetsReply(_message.Message):
    __slots__ = ("broker_sets", "liveness_known", "metadata_age_ms", "from_broker", "rpo_bound_bytes")
    BROKER_SETS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    METADATA_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    RPO_BOUND_BYTES_FIELD_NUMBER: _ClassVar[int]
    broker_sets: _containers.RepeatedCompositeFieldContainer[BrokerSetInfo]
    liveness_known: bool
    metadata_age_ms: int
    from_broker: bool
    rpo_bound_bytes: int
    def __init__(self, broker_sets: _Optional[_Iterable[_Union[BrokerSetInfo, _Mapping]]] = ..., liveness_known: _Optional[bool] = ..., metadata_age_ms: _Optional[int] = ..., from_broker: _Optional[bool] = ..., rpo_bound_bytes: _Optional[int] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "queues", "perm", "retention_ms")
    class QueuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    queues: _containers.ScalarMap[str, int]
    perm: str
    retention_ms: int
    def __init__(self, name: _Optional[str] = ..., queues: _Optional[_Mapping[str, int]] = ..., perm: _Optional[str] = ..., retention_ms: _Optional[int] = ...) -> None: ...

class CreateTopicReply(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicConfig
    def __init__(self, topic: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AlterTopicQueuesRequest(_message.Message):
    __slots__ = ("name", "queues")
    class QueuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    queues: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., queues: _Optional[_Mapping[str, int]] = ...) -> None: ...

class AlterTopicQueuesReply(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicConfig
    def __init__(self, topic: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class AlterTopicRetentionRequest(_message.Message):
    __slots__ = ("name", "retention_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    retention_ms: int
    def __init__(self, name: _Optional[str] = ..., retention_ms: _Optional[int] = ...) -> None: ...

class AlterTopicRetentionReply(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicConfig
    def __init__(self, topic: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreateTopicRequest]
    def __init__(self, topics: _Optional[_Iterable[_Union[CreateTopicRequest, _Mapping]]] = ...) -> None: ...

class CreateTopicResult(_message.Message):
    __slots__ = ("name", "topic", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic: TopicConfig
    error_code: str
    error_message: str
    def __init__(self, name: _Optional[str] = ..., topic: _Optional[_Union[TopicConfig, _Mapping]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class CreateTopicsReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CreateTopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CreateTopicResult, _Mapping]]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("prefix", "start_after", "limit")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    start_after: str
    limit: int
    def __init__(self, prefix: _Optional[str] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListTopicsReply(_message.Message):
    __slots__ = ("topics", "next_start_after", "metadata_age_ms", "from_broker")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_AFTER_FIELD_NUMBER: _ClassVar[int]
    METADATA_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    next_start_after: str
    metadata_age_ms: int
    from_broker: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ..., next_start_after: _Optional[str] = ..., metadata_age_ms: _Optional[int] = ..., from_broker: _Optional[bool] = ...) -> None: ...

class CleanBrokerDataRequest(_message.Message):
    __slots__ = ("broker_set", "broker_ids", "clean_living")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    CLEAN_LIVING_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    broker_ids: _containers.RepeatedScalarFieldContainer[int]
    clean_living: bool
    def __init__(self, broker_set: _Optional[str] = ..., broker_ids: _Optional[_Iterable[int]] = ..., clean_living: _Optional[bool] = ...) -> None: ...

class CleanBrokerDataReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetaCreateRequest(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class MetaGetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class MetaCompareAndSetRequest(_message.Message):
    __slots__ = ("key", "value", "expected_version", "ledger_password")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    expected_version: int
    ledger_password: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., expected_version: _Optional[int] = ..., ledger_password: _Optional[bytes] = ...) -> None: ...

class MetaDeleteRequest(_message.Message):
    __slots__ = ("key", "expected_version", "ledger_password")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    key: str
    expected_version: int
    ledger_password: bytes
    def __init__(self, key: _Optional[str] = ..., expected_version: _Optional[int] = ..., ledger_password: _Optional[bytes] = ...) -> None: ...

class MetaDeleteReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetaListRequest(_message.Message):
    __slots__ = ("prefix", "start_after", "limit")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    start_after: str
    limit: int
    def __init__(self, prefix: _Optional[str] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class MetaListReply(_message.Message):
    __slots__ = ("entries", "next_start_after")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_AFTER_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[MetaEntry]
    next_start_after: str
    def __init__(self, entries: _Optional[_Iterable[_Union[MetaEntry, _Mapping]]] = ..., next_start_after: _Optional[str] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControllerNodeInfo(_message.Message):
    __slots__ = ("id", "raft_address", "grpc_address")
    ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    raft_address: str
    grpc_address: str
    def __init__(self, id: _Optional[str] = ..., raft_address: _Optional[str] = ..., grpc_address: _Optional[str] = ...) -> None: ...

class ClusterStatusReply(_message.Message):
    __slots__ = ("node_id", "raft_state", "leader_id", "leader_address", "term", "commit_index", "last_applied", "ready", "nodes", "brokers_heard", "cluster_epoch", "members")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_STATE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BROKERS_HEARD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    raft_state: str
    leader_id: str
    leader_address: str
    term: int
    commit_index: int
    last_applied: int
    ready: bool
    nodes: _containers.RepeatedCompositeFieldContainer[ControllerNodeInfo]
    brokers_heard: int
    cluster_epoch: int
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., raft_state: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., last_applied: _Optional[int] = ..., ready: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[ControllerNodeInfo, _Mapping]]] = ..., brokers_heard: _Optional[int] = ..., cluster_epoch: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class PlacementViolation(_message.Message):
    __slots__ = ("kind", "name", "code", "broker_set", "reason", "since_ms_ago")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    code: str
    broker_set: str
    reason: str
    since_ms_ago: int
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., code: _Optional[str] = ..., broker_set: _Optional[str] = ..., reason: _Optional[str] = ..., since_ms_ago: _Optional[int] = ...) -> None: ...

class PlacementEvent(_message.Message):
    __slots__ = ("ms_ago", "opened", "violation")
    MS_AGO_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_FIELD_NUMBER: _ClassVar[int]
    ms_ago: int
    opened: bool
    violation: PlacementViolation
    def __init__(self, ms_ago: _Optional[int] = ..., opened: _Optional[bool] = ..., violation: _Optional[_Union[PlacementViolation, _Mapping]] = ...) -> None: ...

class PlacementAuditRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlacementAuditReply(_message.Message):
    __slots__ = ("violations", "events", "required", "repairs")
    class RequiredEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DatacenterList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DatacenterList, _Mapping]] = ...) -> None: ...
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    violations: _containers.RepeatedCompositeFieldContainer[PlacementViolation]
    events: _containers.RepeatedCompositeFieldContainer[PlacementEvent]
    required: _containers.MessageMap[str, DatacenterList]
    repairs: _containers.RepeatedCompositeFieldContainer[LedgerRepair]
    def __init__(self, violations: _Optional[_Iterable[_Union[PlacementViolation, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[PlacementEvent, _Mapping]]] = ..., required: _Optional[_Mapping[str, DatacenterList]] = ..., repairs: _Optional[_Iterable[_Union[LedgerRepair, _Mapping]]] = ...) -> None: ...

class DatacenterList(_message.Message):
    __slots__ = ("datacenters",)
    DATACENTERS_FIELD_NUMBER: _ClassVar[int]
    datacenters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, datacenters: _Optional[_Iterable[str]] = ...) -> None: ...

class DecommissionBrokerRequest(_message.Message):
    __slots__ = ("broker_set", "broker_id", "force", "replacement")
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    broker_id: int
    force: bool
    replacement: int
    def __init__(self, broker_set: _Optional[str] = ..., broker_id: _Optional[int] = ..., force: _Optional[bool] = ..., replacement: _Optional[int] = ...) -> None: ...

class DecommissionBrokerReply(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: RoleAssignment
    def __init__(self, role: _Optional[_Union[RoleAssignment, _Mapping]] = ...) -> None: ...

class RepairPlacementRequest(_message.Message):
    __slots__ = ("max_ledgers",)
    MAX_LEDGERS_FIELD_NUMBER: _ClassVar[int]
    max_ledgers: int
    def __init__(self, max_ledgers: _Optional[int] = ...) -> None: ...

class LedgerRepair(_message.Message):
    __slots__ = ("broker_set", "ledger", "replaced", "ms_ago")
    class ReplacedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    BROKER_SET_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    MS_AGO_FIELD_NUMBER: _ClassVar[int]
    broker_set: str
    ledger: str
    replaced: _containers.ScalarMap[int, int]
    ms_ago: int
    def __init__(self, broker_set: _Optional[str] = ..., ledger: _Optional[str] = ..., replaced: _Optional[_Mapping[int, int]] = ..., ms_ago: _Optional[int] = ...) -> None: ...

class RepairPlacementReply(_message.Message):
    __slots__ = ("repaired", "remaining", "advice")
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    repaired: _containers.RepeatedCompositeFieldContainer[LedgerRepair]
    remaining: _containers.RepeatedCompositeFieldContainer[PlacementViolation]
    advice: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, repaired: _Optional[_Iterable[_Union[LedgerRepair, _Mapping]]] = ..., remaining: _Optional[_Iterable[_Union[PlacementViolation, _Mapping]]] = ..., advice: _Optional[_Iterable[str]] = ...) -> None: ...
