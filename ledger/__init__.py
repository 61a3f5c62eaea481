"""BookKeeper-compatible ledgers on the commit log: fencing, LAC, recovery with quorum coverage.

Theory of operation
-------------------
A ledger lives in one broker set. Its ensemble is that set's replicas, every entry goes to all of
them (E = WQ), and an add is acknowledged once AQ replicas confirmed it (AQ ≤ WQ, chosen at
creation). The metadata (state OPEN / IN_RECOVERY / CLOSED, where it ends, quorums, digest,
password hash) is controller state written by compare-and-set.

This package is built as a pure core and a thin shell (docs/ARCHITECTURE.md §2.1):

- `metadata`: the metadata record and its JSON encoding, creation checks, the state table.
- `recovery`: fencing and recovery decisions (`FenceTracker`, `EntryRecoveryTracker`, the
  `Recovery` state machine that hands back actions), and the writer's add rules.
- `digest`: the per-entry digests writers compute and readers check.
- `client`: the API — `AsyncLedgers(async_client)`, and `Ledgers(client)` for a sync
  `tidelog.client.Client` — the I/O shell that drives the cores above, split into modules named
  for their jobs (listed there). Its use is described in `API.md`.
- `segmented`: `SegmentedLog`, an unbounded log made of ledgers (`SEGMENTED.md`).

The ledger package builds on `tidelog.client` (its connections and its event loop thread,
`tidelog.client.runner`); `tidelog.client` never imports this package.

The I/O shell (gRPC calls to the replicas, the controller CAS, timeouts) drives these objects
and never decides anything itself. The rules, numbered, and where we differ from BookKeeper's
code are in `RULES.md`. Errors carry BookKeeper's numeric codes as `number`.
"""

import importlib
from typing import TYPE_CHECKING, Any

from tidelog.errors import (
    DigestMatchError,
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReadError,
    LedgerRecoveryError,
    LedgerTimeoutError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerExistsError,
    NotEnoughBookiesError,
    SegmentedLogOwnershipLostError,
    UnauthorizedAccessError,
)
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import (
    STATE_CHANGES,
    TRANSITIONS,
    DigestType,
    LedgerEvent,
    LedgerMetadata,
    LedgerState,
    Outcome,
    apply_transition,
    check_create_params,
    check_update,
    decide_transition,
    hash_password,
    new_ledger_metadata,
)
from tidelog.ledger.recovery import (
    RECOVERY_TRANSITIONS,
    CloseLedger,
    EntryDecision,
    EntryRecoveryTracker,
    FenceOutcome,
    FenceTracker,
    MarkInRecovery,
    ReadEntry,
    ReadOutcome,
    Recovery,
    RecoveryProtocolError,
    RecoveryResult,
    RecoveryState,
    RewriteEntry,
    SendFence,
    WriterLedger,
    advance_lac,
    fencing_quorum,
    negative_quorum,
)

if TYPE_CHECKING:
    from tidelog.ledger.client import (
        MAX_ENTRY_BYTES,
        AsyncLedgers,
        AsyncReadHandle,
        AsyncWriteHandle,
        LedgerEntry,
        Ledgers,
        ReadHandle,
        WriteHandle,
    )
    from tidelog.ledger.segmented import (
        AsyncSegmentedLog,
        Position,
        RollPolicy,
        SegmentedLog,
        SegmentedLogRecord,
    )

# The client API sits a layer above these rules (docs/ARCHITECTURE.md §2.2): the controller and the
# replica import the rules without loading the client, and `from tidelog.ledger import Ledgers`
# loads it on first use.
_LAZY = {
    "MAX_ENTRY_BYTES": "tidelog.ledger.client",
    "AsyncLedgers": "tidelog.ledger.client",
    "AsyncReadHandle": "tidelog.ledger.client",
    "AsyncWriteHandle": "tidelog.ledger.client",
    "LedgerEntry": "tidelog.ledger.client",
    "Ledgers": "tidelog.ledger.client",
    "ReadHandle": "tidelog.ledger.client",
    "WriteHandle": "tidelog.ledger.client",
    "AsyncSegmentedLog": "tidelog.ledger.segmented",
    "Position": "tidelog.ledger.segmented",
    "RollPolicy": "tidelog.ledger.segmented",
    "SegmentedLog": "tidelog.ledger.segmented",
    "SegmentedLogRecord": "tidelog.ledger.segmented",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "MAX_ENTRY_BYTES",
    "RECOVERY_TRANSITIONS",
    "STATE_CHANGES",
    "TRANSITIONS",
    "AsyncLedgers",
    "AsyncReadHandle",
    "AsyncWriteHandle",
    "CloseLedger",
    "Digester",
    "DigestMatchError",
    "DigestType",
    "EntryDecision",
    "EntryRecoveryTracker",
    "FenceOutcome",
    "FenceTracker",
    "IllegalOpError",
    "IncorrectParameterError",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerEvent",
    "LedgerFencedError",
    "LedgerMetadata",
    "LedgerReadError",
    "LedgerRecoveryError",
    "LedgerState",
    "LedgerTimeoutError",
    "Ledgers",
    "MarkInRecovery",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerExistsError",
    "NotEnoughBookiesError",
    "Outcome",
    "ReadEntry",
    "ReadHandle",
    "ReadOutcome",
    "Recovery",
    "RecoveryProtocolError",
    "RecoveryResult",
    "RecoveryState",
    "RewriteEntry",
    "SendFence",
    "UnauthorizedAccessError",
    "WriteHandle",
    "WriterLedger",
    "advance_lac",
    "apply_transition",
    "check_create_params",
    "check_update",
    "decide_transition",
    "fencing_quorum",
    "hash_password",
    "negative_quorum",
    "new_ledger_metadata",
    "AsyncSegmentedLog",
    "Position",
    "RollPolicy",
    "SegmentedLog",
    "SegmentedLogOwnershipLostError",
    "SegmentedLogRecord",
]
