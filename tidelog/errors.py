"""Every error tidelog raises on purpose, in one place.

Each error class carries:
- `code`: a stable upper-case name. It travels on the wire (gRPC trailing metadata
  `tidelog-error-code`) so a client re-raises the same class it would have got in-process.
- `status`: the gRPC status code name the service layer answers with.
- `hint`: what the caller should do about it.

Components add their errors here (one module, so wire codes cannot collide) and the service
layers map them with `by_code`. Unexpected exceptions are bugs, not errors of this module.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TidelogError(Exception):
    """Base of all deliberate tidelog errors."""

    code: ClassVar[str] = "UNKNOWN"
    status: ClassVar[str] = "UNKNOWN"
    hint: ClassVar[str] = ""
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "", *, hint: str | None = None, **details: Any) -> None:
        self.message = message or self.__class__.__doc__ or self.code
        self.details = details
        if hint is not None:
            self.hint = hint  # type: ignore[misc]
        super().__init__(self.message)

    def __str__(self) -> str:
        text = f"{self.code}: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


_REGISTRY: dict[str, type[TidelogError]] = {}


def _register(cls: type[TidelogError]) -> type[TidelogError]:
    if cls.code in _REGISTRY and _REGISTRY[cls.code] is not cls:
        raise RuntimeError(f"duplicate error code {cls.code}")
    _REGISTRY[cls.code] = cls
    return cls


def by_code(code: str) -> type[TidelogError]:
    """The error class for a wire code; unknown codes map to the base class."""
    return _REGISTRY.get(code, TidelogError)


def all_codes() -> dict[str, type[TidelogError]]:
    return dict(_REGISTRY)


# --- generic ------------------------------------------------------------------------------


@_register
class InvalidArgumentError(TidelogError):
    """The request is malformed or a value is out of range."""

    code = "INVALID_ARGUMENT"
    status = "INVALID_ARGUMENT"
    hint = "fix the request; nothing was stored"


@_register
class ConfigError(TidelogError):
    """A configuration file or option is invalid."""

    code = "CONFIG_INVALID"
    status = "INVALID_ARGUMENT"
    hint = "fix the configuration and start again"


@_register
class InsecurePermissionsError(ConfigError):
    """A data directory, secret or key file that other local accounts could read: the process
    refuses to start on it rather than serve from it (as OpenSSH and PostgreSQL do)."""

    code = "INSECURE_PERMISSIONS"
    status = "FAILED_PRECONDITION"
    hint = "make it private to the account that runs tidelog: chmod 700 for a directory, 600 for a file"


@_register
class UnavailableError(TidelogError):
    """A server could not be reached or is not serving yet."""

    code = "UNAVAILABLE"
    status = "UNAVAILABLE"
    hint = "retry later or check that the process is running"
    retryable = True


@_register
class UnsupportedCallError(TidelogError):
    """The server does not know this call: it runs an older release than the caller."""

    code = "UNIMPLEMENTED"
    status = "UNIMPLEMENTED"
    hint = "upgrade the server to the caller's release (a client may fall back to an older call)"


# --- storage (commitlog) ------------------------------------------------------------------


@_register
class CorruptRecordError(TidelogError):
    """A record that should be intact failed validation (length, magic or CRC)."""

    code = "CORRUPT_RECORD"
    status = "DATA_LOSS"
    hint = "the store refuses to guess; restore this replica from another one"

    def __init__(self, path: str, offset: int, reason: str, size: int | None = None) -> None:
        super().__init__(f"corrupt record in {path} at offset {offset}: {reason}", path=path, offset=offset)
        self.path = path
        self.offset = offset
        self.reason = reason
        self.size = size  # the record's size by the index, when known: the range to repair


@_register
class OffsetBelowRetentionError(TidelogError):
    """The offset was written once but retention has deleted it."""

    code = "OFFSET_BELOW_RETENTION"
    status = "OUT_OF_RANGE"
    hint = "start from the current minimum offset"

    def __init__(
        self, offset: int, min_offset: int, what: str = "offset", *, hint: str | None = None
    ) -> None:
        super().__init__(
            f"{what} {offset} is below retention (minimum is {min_offset})",
            hint=hint,
            offset=offset,
            min_offset=min_offset,
        )
        self.offset = offset
        self.min_offset = min_offset


@_register
class DataUnavailableError(TidelogError):
    """A range that should exist could not be read; this is never "no such entry"."""

    code = "DATA_UNAVAILABLE"
    status = "DATA_LOSS"
    hint = "read from another replica"
    retryable = True


@_register
class OffsetMismatchError(TidelogError):
    """A raw append or truncation did not land on the expected offset."""

    code = "OFFSET_MISMATCH"
    status = "FAILED_PRECONDITION"
    hint = "re-handshake with the master and resume from the local max offset"


@_register
class MessageTooLargeError(TidelogError):
    """A message or batch exceeds the configured maximum size."""

    code = "MESSAGE_ILLEGAL"
    status = "INVALID_ARGUMENT"
    hint = (
        "send smaller messages: a record is limited by the broker's max_message_bytes, and its "
        "key, tags and properties together by a fixed 32 KiB"
    )


@_register
class EpochRejectedError(TidelogError):
    """An epoch entry would make epochs or start offsets go backwards."""

    code = "EPOCH_REJECTED"
    status = "FAILED_PRECONDITION"
    hint = "epochs only grow; this request comes from an older term"


@_register
class StoreClosedError(TidelogError):
    """The store is closed."""

    code = "STORE_CLOSED"
    status = "UNAVAILABLE"
    hint = "the broker is shutting down; retry on another replica"
    retryable = True


@_register
class MessageNotFoundError(TidelogError):
    """No confirmed message is where a lookup looked: an id that names no record (a forged or
    stale id, an offset inside a record or past the log), or a queue offset not written yet."""

    code = "MESSAGE_NOT_FOUND"
    status = "NOT_FOUND"
    hint = (
        "check the id or offset; a message is found once it is confirmed, and never below "
        "retention (that answers OFFSET_BELOW_RETENTION)"
    )


# --- controller ---------------------------------------------------------------------------
# `number` is RocketMQ's ResponseCode for the same condition, kept so logs and drills can be
# compared side by side with a RocketMQ controller. The rules that produce each code are in
# controller/RULES.md.


@_register
class ControllerFencedMasterEpochError(TidelogError):
    """The request carries a master epoch other than the controller's current one."""

    code = "CONTROLLER_FENCED_MASTER_EPOCH"
    status = "FAILED_PRECONDITION"
    number = 2000
    hint = "a newer master term exists; refresh the role from the controller and step down if demoted"


@_register
class ControllerFencedSyncStateSetEpochError(TidelogError):
    """The request carries a SyncStateSet epoch other than the controller's current one."""

    code = "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH"
    status = "FAILED_PRECONDITION"
    number = 2001
    hint = "the SyncStateSet changed meanwhile; fetch it again and recompute the change"


@_register
class ControllerInvalidMasterError(TidelogError):
    """The broker that asked is not the current master of its broker set."""

    code = "CONTROLLER_INVALID_MASTER"
    status = "FAILED_PRECONDITION"
    number = 2002
    hint = "only the current master may change the SyncStateSet; refresh the role from the controller"


@_register
class ControllerInvalidReplicasError(TidelogError):
    """A proposed SyncStateSet names a broker id that is not registered in the set."""

    code = "CONTROLLER_INVALID_REPLICAS"
    status = "FAILED_PRECONDITION"
    number = 2003
    hint = "propose only registered broker ids of this broker set"


@_register
class ControllerMasterNotAvailableError(TidelogError):
    """No member could be elected master; the broker set takes no writes for now."""

    code = "CONTROLLER_MASTER_NOT_AVAILABLE"
    status = "UNAVAILABLE"
    number = 2004
    hint = "bring a SyncStateSet member back, or (accepting data loss) enable unclean election"
    retryable = True


@_register
class ControllerInvalidRequestError(TidelogError):
    """A controller request is missing a field it needs (for example a heartbeat without a broker id)."""

    code = "CONTROLLER_INVALID_REQUEST"
    status = "INVALID_ARGUMENT"
    number = 2005
    hint = "register first to obtain a broker id, then send it with every request"


@_register
class ControllerBrokerNotAliveError(TidelogError):
    """A broker the request depends on has no fresh heartbeat at the controller leader."""

    code = "CONTROLLER_BROKER_NOT_ALIVE"
    status = "FAILED_PRECONDITION"
    number = 2006
    hint = "wait until the broker heartbeats again, or leave it out of the request"


@_register
class ControllerNotLeaderError(TidelogError):
    """This controller node is not the Raft leader and cannot serve the request."""

    code = "CONTROLLER_NOT_LEADER"
    status = "UNAVAILABLE"
    number = 2007
    hint = "retry against the leader address carried by this error (or any controller if it is unknown)"
    retryable = True

    def __init__(self, message: str = "", *, leader: str | None = None, **details: Any) -> None:
        super().__init__(
            message or f"not the controller leader (leader: {leader or 'unknown'})", leader=leader, **details
        )
        self.leader = leader


@_register
class TopicGenerationPendingError(UnavailableError):
    """A slave knows a topic (just created, or made again after a deletion) from the controller
    but has not yet received the master's marker that starts it in the log: it serves the topic
    once the marker arrives, a moment later."""

    code = "TOPIC_GENERATION_PENDING"
    status = "UNAVAILABLE"
    hint = "retry, or read from the master"


@_register
class ControllerUnavailableError(UnavailableError):
    """No controller quorum answered: what needs one (an election, a SyncStateSet change, a topic
    create or delete, a ledger create, close or recovery, a user or grant change, a consumer group's
    membership) waits. Writes and reads of running broker sets go on without it."""

    code = "CONTROLLER_UNAVAILABLE"
    status = "UNAVAILABLE"
    hint = (
        "retry once a majority of the controllers is back (tide cluster status shows the brokers' own "
        "view meanwhile); produce and consume keep working through the brokers"
    )
    retryable = True


@_register
class ControllerBrokerMetadataNotExistError(TidelogError):
    """The controller has no broker set of that name."""

    code = "CONTROLLER_BROKER_METADATA_NOT_EXIST"
    status = "NOT_FOUND"
    number = 2008
    hint = "check the broker set name; a broker set exists once its first broker registers"


@_register
class ControllerInvalidCleanBrokerMetadataError(TidelogError):
    """Broker data cannot be cleaned: the set is unknown or a broker to clean is still alive."""

    code = "CONTROLLER_INVALID_CLEAN_BROKER_METADATA"
    status = "FAILED_PRECONDITION"
    number = 2009
    hint = "stop the brokers first (or pass clean_living to remove live brokers on purpose)"


@_register
class PlacementRefusedError(TidelogError):
    """Taking the broker out would break the broker set's placement or safety (controller RULES.md PL7)."""

    code = "PLACEMENT_REFUSED"
    status = "FAILED_PRECONDITION"
    hint = "bring another replica in sync first (tide placement status), or pass --force where the message allows it"


@_register
class ControllerBrokerNeedToBeRegisteredError(TidelogError):
    """The broker id is not (or no longer) registered in this broker set."""

    code = "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED"
    status = "FAILED_PRECONDITION"
    number = 2010
    hint = "the controller forgot this broker (its data was cleaned); discard the local broker identity and register as a new broker"


@_register
class ControllerMasterStillExistError(TidelogError):
    """The election would keep the current master: it is alive and was not asked to hand over."""

    code = "CONTROLLER_MASTER_STILL_EXIST"
    status = "FAILED_PRECONDITION"
    number = 2011
    hint = "nothing to do; follow the current master carried in the reply"


@_register
class ControllerElectMasterFailedError(TidelogError):
    """No eligible broker for a broker- or operator-triggered election; nothing changed."""

    code = "CONTROLLER_ELECT_MASTER_FAILED"
    status = "FAILED_PRECONDITION"
    number = 2012
    hint = "the candidate must be alive and (unless unclean election is enabled) in the SyncStateSet"


@_register
class ControllerAlterSyncStateSetFailedError(TidelogError):
    """The SyncStateSet change was refused (unknown set, no change, or the master left out)."""

    code = "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED"
    status = "FAILED_PRECONDITION"
    number = 2013
    hint = "propose a set that differs from the current one and contains the master"


@_register
class ClusterMismatchError(TidelogError):
    """The broker's data directory belongs to another cluster (its identity file names another cluster id)."""

    code = "CLUSTER_MISMATCH"
    status = "FAILED_PRECONDITION"
    hint = (
        "this disk was written by another cluster: point the broker at its own data directory, or wipe this "
        "one to join as a new, empty replica"
    )


@_register
class ClusterEpochFencedError(TidelogError):
    """A controller answered from an older cluster epoch than one already seen: it belongs to a
    controller cluster that a forced quorum recovery replaced (docs/RUNBOOK-quorum.md)."""

    code = "CLUSTER_EPOCH_FENCED"
    status = "UNAVAILABLE"
    number = 2015
    hint = (
        "this controller was replaced by a forced recovery: stop it, wipe its data dir and add it "
        "back with `tide controller add-node` (docs/RUNBOOK-quorum.md); other controllers are asked meanwhile"
    )
    retryable = True


@_register
class ControllerBrokerIdInvalidError(TidelogError):
    """The broker id was never assigned, or it is bound to another broker identity."""

    code = "CONTROLLER_BROKER_ID_INVALID"
    status = "FAILED_PRECONDITION"
    number = 2014
    hint = (
        "two brokers claim one id: check the broker's data directory; register without an id to get a new one"
    )


@_register
class TopicExistsError(TidelogError):
    """A topic of that name already exists."""

    code = "TOPIC_EXISTS"
    status = "ALREADY_EXISTS"
    number = 18
    hint = "use the existing topic or delete it first"


@_register
class TopicLimitReachedError(TidelogError):
    """The cluster holds as many topics as its controllers' `max_topics` allows."""

    code = "TOPIC_LIMIT_REACHED"
    status = "RESOURCE_EXHAUSTED"
    hint = "delete topics you no longer need, or raise max_topics in the controllers' config"


@_register
class GroupLimitReachedError(TidelogError):
    """The broker holds the commits of as many consumer groups as its `max_groups` allows."""

    code = "GROUP_LIMIT_REACHED"
    status = "RESOURCE_EXHAUSTED"
    hint = "delete consumer groups you no longer need (tide group delete), or raise max_groups in the brokers' config"


@_register
class MetadataLimitReachedError(TidelogError):
    """The controllers hold as many metadata entries (ledgers, mostly) as `max_metadata_entries`
    allows."""

    code = "METADATA_LIMIT_REACHED"
    status = "RESOURCE_EXHAUSTED"
    hint = "delete ledgers you no longer need, or raise max_metadata_entries in the controllers' config"


@_register
class TopicNotFoundError(TidelogError):
    """No topic of that name exists."""

    code = "TOPIC_NOT_FOUND"
    status = "NOT_FOUND"
    number = 17
    hint = "create the topic first, or check its name"


@_register
class MetadataExistsError(TidelogError):
    """A metadata key already exists."""

    code = "METADATA_EXISTS"
    status = "ALREADY_EXISTS"
    hint = "read the key and compare-and-set it with its version instead"


@_register
class MetadataNotFoundError(TidelogError):
    """No metadata is stored under that key."""

    code = "METADATA_NOT_FOUND"
    status = "NOT_FOUND"
    hint = "create the key first, or check its name"


@_register
class MetadataVersionMismatchError(TidelogError):
    """The metadata changed since the caller read it (compare-and-set lost)."""

    code = "METADATA_VERSION_MISMATCH"
    status = "ABORTED"
    hint = "read the key again and redo the read-modify-write with the new version"


@_register
class MetadataTooLargeError(TidelogError):
    """A metadata value exceeds the controller's size limit."""

    code = "METADATA_TOO_LARGE"
    status = "INVALID_ARGUMENT"
    hint = "store large data elsewhere and keep only a reference in the controller"


# --- replication (ha / broker) ------------------------------------------------------------
# Send outcomes follow docs/reference/rocketmq-controller-ha.md §4: FLUSH_SLAVE_TIMEOUT and FLUSH_DISK_TIMEOUT mean the message
# IS in the master's log (RocketMQ counts them as "sendOK"); IN_SYNC_REPLICAS_NOT_ENOUGH means
# nothing was written. Clients must not treat the two kinds alike.


@_register
class HaProtocolError(TidelogError):
    """A malformed HA frame (bad length, unknown type, truncated or oversized fields, bad UTF-8)."""

    code = "HA_PROTOCOL"
    status = "INTERNAL"
    hint = "the HA connection is closed and the slave reconnects; if it repeats, check both brokers run the same version"


@_register
class NotMasterError(TidelogError):
    """This broker is not the master of its broker set and cannot take writes."""

    code = "NOT_MASTER"
    status = "FAILED_PRECONDITION"
    hint = "send the write to the master address carried by this error, or refresh the route if it is empty"

    def __init__(self, message: str = "", *, master_address: str = "", **details: Any) -> None:
        # The gRPC convention (tidelog.wire) carries an error's redirect as "leader"; a client
        # rebuilding this error from the wire hands the address back under that name.
        master_address = master_address or str(details.pop("leader", None) or "")
        super().__init__(
            message or f"not the master (master: {master_address or 'unknown'})",
            master_address=master_address,
            **details,
        )
        self.master_address = master_address

    @property
    def leader(self) -> str | None:
        """The master address under the name the wire convention sends as its redirect."""
        return self.master_address or None


@_register
class InSyncReplicasNotEnoughError(TidelogError):
    """The SyncStateSet is smaller than the write needs; the write was refused before anything was stored."""

    code = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    status = "UNAVAILABLE"
    hint = (
        "nothing was written, so retrying is safe: retry later or on another broker set once slaves catch up"
    )
    retryable = True


@_register
class FlushSlaveTimeoutError(TidelogError):
    """The write did not get enough replica acks before the deadline."""

    code = "FLUSH_SLAVE_TIMEOUT"
    status = "DEADLINE_EXCEEDED"
    hint = (
        "the message IS stored on the master and may still replicate, so the outcome is unknown; "
        "retrying may store it twice, so retry only if consumers tolerate duplicates (or deduplicate by key)"
    )


@_register
class RpoBoundReachedError(TidelogError):
    """A master alone in its SyncStateSet is `rpo_bound_bytes` past what every controller holds of
    its reports, and no grant from them came before the deadline (controller/RULES.md L10)."""

    code = "RPO_BOUND_REACHED"
    status = "DEADLINE_EXCEEDED"
    hint = (
        "the message IS stored on the master and may still be acknowledged, so the outcome is unknown; "
        "check that every controller node is up and reachable (tide controller status), or bring a "
        "slave back into the SyncStateSet, then retry (consumers may see it twice)"
    )


@_register
class SlaveNotAvailableError(TidelogError):
    """No slave is connected to replicate a write that needs replica acks."""

    code = "SLAVE_NOT_AVAILABLE"
    status = "UNAVAILABLE"
    hint = (
        "start or reconnect a slave of this broker set, or send to another broker set; if the master "
        "had already stored the message it replicates once a slave connects, so as with FLUSH_SLAVE_TIMEOUT "
        "a retry may duplicate it"
    )


@_register
class FlushDiskTimeoutError(TidelogError):
    """The write was appended but not flushed to disk before the deadline."""

    code = "FLUSH_DISK_TIMEOUT"
    status = "DEADLINE_EXCEEDED"
    hint = (
        "the message is in the master's log but may not be on disk yet, so the outcome is unknown; "
        "retrying may store it twice; check disk latency"
    )


# --- client -----------------------------------------------------------------------------------


@_register
class SendFailedError(TidelogError):
    """The producer gave up: every attempt within its time budget failed."""

    code = "SEND_FAILED"
    status = "UNAVAILABLE"
    hint = (
        "check `tide cluster status`; if an attempt timed out after the broker stored the message, "
        "it may still be delivered, so a retry can duplicate it"
    )
    retryable = True


@_register
class SubscriptionConflictError(TidelogError):
    """This consumer cannot join its group: an exclusive member already reads the topic, or the
    group's live members read it in another subscription mode."""

    code = "SUBSCRIPTION_CONFLICT"
    status = "FAILED_PRECONDITION"
    hint = (
        "wait until the other member leaves (its session ends after session_timeout), use another "
        "group name, or use the mode the group's members use (`tide group describe`)"
    )


@_register
class ReceiptInvalidError(TidelogError):
    """A receipt handle of the shared mode is not the current lease of its message: its invisible
    time ran out and the message went to another receive, or it was never given."""

    code = "RECEIPT_INVALID"
    status = "FAILED_PRECONDITION"
    hint = "receive the message again; acknowledge within its invisible duration, or extend it"


# --- ledger -------------------------------------------------------------------------------
# `number` is BookKeeper's BKException code for the same condition (reference
# bookkeeper-ledger.md §1.4), so logs and tests can be compared with a BookKeeper client.
# The rules that produce each error are in ledger/RULES.md. Codes carry a LEDGER_ prefix so
# they cannot collide with the storage or controller codes of similar names.


@_register
class LedgerReadError(TidelogError):
    """A ledger read failed (for example beyond the LAC known to the reader)."""

    code = "LEDGER_READ"
    status = "OUT_OF_RANGE"
    number = -1
    hint = "read up to the last add confirmed, or refresh it with a LAC read first"


@_register
class DigestMatchError(TidelogError):
    """The digest type differs from the ledger's, or an entry failed its digest check."""

    code = "LEDGER_DIGEST_MISMATCH"
    status = "FAILED_PRECONDITION"
    number = -5
    hint = "open with the ledger's digest type; a corrupt entry is read from another replica"


@_register
class NotEnoughBookiesError(TidelogError):
    """Fewer replicas of the broker set are available than the ledger needs."""

    code = "LEDGER_NOT_ENOUGH_REPLICAS"
    status = "UNAVAILABLE"
    number = -6
    hint = "wait until the broker set's replicas are back, or create the ledger on another broker set"
    retryable = True


@_register
class LedgerRecoveryError(TidelogError):
    """Recovery could not decide safely (an entry or fencing stayed unknown); nothing was closed."""

    code = "LEDGER_RECOVERY"
    status = "UNAVAILABLE"
    number = -10
    hint = "retry the recovery open once the replicas answer; recovery never guesses past an unknown"
    retryable = True


@_register
class LedgerClosedError(TidelogError):
    """The ledger (or this handle) is closed; nothing more can be added."""

    code = "LEDGER_CLOSED"
    status = "FAILED_PRECONDITION"
    number = -11
    hint = "the ledger is sealed; open it for reading, or create a new ledger to keep writing"


@_register
class NoSuchEntryError(TidelogError):
    """The entry does not exist (the replicas that answered know they never had it)."""

    code = "LEDGER_NO_SUCH_ENTRY"
    status = "NOT_FOUND"
    number = -13
    hint = "check the entry id against the ledger's last entry id or LAC"


@_register
class IncorrectParameterError(TidelogError):
    """A ledger request has an invalid parameter (quorum sizes, ids, ranges, missing password)."""

    code = "LEDGER_INCORRECT_PARAMETER"
    status = "INVALID_ARGUMENT"
    number = -14
    hint = "fix the request; nothing was stored"


@_register
class MetadataVersionError(TidelogError):
    """The ledger metadata is not what this handle expected (closed by someone else with other values)."""

    code = "LEDGER_METADATA_VERSION"
    status = "ABORTED"
    number = -17
    hint = "read the ledger metadata again; its last entry id and length are the ledger's end"


@_register
class LedgerTimeoutError(TidelogError):
    """A replica did not answer a ledger request in time."""

    code = "LEDGER_TIMEOUT"
    status = "DEADLINE_EXCEEDED"
    number = -23
    hint = "the outcome is unknown; retry, or recover the ledger to learn where it ends"
    retryable = True


@_register
class NoSuchLedgerExistsError(TidelogError):
    """No ledger with this id exists in the metadata."""

    code = "LEDGER_NO_SUCH_LEDGER"
    status = "NOT_FOUND"
    number = -25
    hint = "check the ledger id (ids are never negative)"


@_register
class IllegalOpError(TidelogError):
    """The operation is not allowed on this handle or in the ledger's current state."""

    code = "LEDGER_ILLEGAL_OP"
    status = "FAILED_PRECONDITION"
    number = -100
    hint = "add only through the handle that created the ledger; metadata states only move forward"


@_register
class LedgerFencedError(TidelogError):
    """Another client has fenced this ledger to recover it; this writer may no longer add."""

    code = "LEDGER_FENCED"
    status = "FAILED_PRECONDITION"
    number = -101
    hint = (
        "the outcome of the failed add is unknown: recovery decides whether it exists; "
        "open the ledger with recovery to read where it ends"
    )


@_register
class UnauthorizedAccessError(TidelogError):
    """The password does not match the ledger's."""

    code = "LEDGER_UNAUTHORIZED"
    status = "PERMISSION_DENIED"
    number = -102
    hint = "open the ledger with the password it was created with"


# --- segmented log ------------------------------------------------------------------------


@_register
class SegmentedLogOwnershipLostError(TidelogError):
    """Another owner acquired this segmented log (or its ledger was recovered); this owner may no longer append."""

    code = "SEGMENTED_LOG_OWNERSHIP_LOST"
    status = "FAILED_PRECONDITION"
    hint = (
        "the failed append's outcome is unknown: read the log to learn whether it is there; "
        "acquire the log again to keep appending"
    )


# --- cluster membership -------------------------------------------------------------------


@_register
class UnauthenticatedError(TidelogError):
    """The caller did not prove who it is: the cluster secret for a call that changes cluster
    membership, a user's signature for any other call once auth is on (tidelog/guard.py)."""

    code = "UNAUTHENTICATED"
    status = "UNAUTHENTICATED"
    hint = (
        "a client signs as a user: --access-key/--secret-key or $TIDE_ACCESS_KEY/$TIDE_SECRET_KEY; "
        "a cluster member proves the cluster secret (key 'secret' in its config or "
        "$TIDE_CLUSTER_SECRET), the same value as the controllers'"
    )


@_register
class PermissionDeniedError(TidelogError):
    """The caller is a known user, but lacks the permission a call needs (tidelog/acl.py)."""

    code = "PERMISSION_DENIED"
    status = "PERMISSION_DENIED"
    hint = "ask an administrator for the permission the message names (`tide acl grant`)"


@_register
class UserExistsError(TidelogError):
    """A user of that name, or with that access key, already exists."""

    code = "USER_EXISTS"
    status = "ALREADY_EXISTS"
    hint = "pick another name, or delete the user first (`tide user delete`)"


@_register
class UserNotFoundError(TidelogError):
    """No user of that name."""

    code = "USER_NOT_FOUND"
    status = "NOT_FOUND"
    hint = "`tide user list` names the users"


# --- storage failures ---------------------------------------------------------------------


@_register
class DiskFullError(TidelogError):
    """The broker's disk is full: the write was not stored, and this broker steps down until it has room."""

    code = "DISK_FULL"
    status = "UNAVAILABLE"
    retryable = True
    hint = "retry: another replica takes over; the operator must free space on this broker's disk"


@_register
class StoreError(TidelogError):
    """The broker could not write or sync its store: the write was not acknowledged, and this broker steps down."""

    code = "STORE_ERROR"
    status = "UNAVAILABLE"
    retryable = True
    hint = "retry: another replica takes over; check the broker's disk and its log"


# --- topic deletion (broker topics, controller topic rules) ---------------------------------


@_register
class TopicDeletionPendingError(TidelogError):
    """The topic was deleted moments ago; a topic of that name cannot be created yet."""

    code = "TOPIC_DELETION_PENDING"
    status = "UNAVAILABLE"
    hint = (
        "retry once the brokers have had time to drop the deleted topic's data "
        "(one controller heartbeat timeout after the delete)"
    )
    retryable = True


# --- operator commands (topic alter and delete, broker drain) ---------------------------------


@_register
class TopicQueuesShrinkError(TidelogError):
    """A topic's queue count in a broker set can only go up."""

    code = "TOPIC_QUEUES_SHRINK"
    status = "FAILED_PRECONDITION"
    hint = (
        "queues never go down (their messages and committed offsets would be orphaned); "
        "create a new topic with fewer queues instead"
    )


@_register
class TopicInUseError(TidelogError):
    """A consumer group still reads the topic."""

    code = "TOPIC_IN_USE"
    status = "FAILED_PRECONDITION"
    hint = "stop its consumers and wait for their sessions to lapse, or pass --force"


@_register
class NoOtherInSyncReplicaError(TidelogError):
    """No other alive in-sync replica can take the master role over."""

    code = "NO_OTHER_IN_SYNC_REPLICA"
    status = "FAILED_PRECONDITION"
    hint = (
        "start or repair a slave and wait until it is in the SyncStateSet (`tide broker list`), "
        "then drain again; stopping the master now would leave the broker set without writes"
    )


# --- consumer-group offsets admin (tide group reset-offsets / delete) ----------------------------


@_register
class GroupNotFoundError(TidelogError):
    """The consumer group has no committed offsets and no members: nothing knows it."""

    code = "GROUP_NOT_FOUND"
    status = "NOT_FOUND"
    hint = (
        "check the group's name; a group exists once one of its members has consumed "
        "(`tide consume --group NAME`) or committed an offset"
    )


@_register
class GroupInUseError(TidelogError):
    """The consumer group has live members, whose own positions would overwrite the change."""

    code = "GROUP_IN_USE"
    status = "FAILED_PRECONDITION"
    hint = (
        "stop its consumers and wait for their sessions to lapse (a few seconds), or pass --force "
        "(its members then drop their queues and start them again from the new offsets)"
    )


@_register
class ResetOffsetOutOfRangeError(TidelogError):
    """A reset would put a queue at an offset it does not have: nothing was changed."""

    code = "RESET_OFFSET_OUT_OF_RANGE"
    status = "OUT_OF_RANGE"
    hint = (
        "pick an offset between the queue's min and confirmed offsets (`tide topic describe TOPIC`), "
        "limit the reset to some queues with --queue/--broker-set, or reset --to earliest|latest"
    )
