"""The ledger client API: create, write, open (with or without recovery), read, tail, delete.

This module is the API's one place to import from; the code lives in modules named for their
jobs, and every public name of theirs is re-exported here:

- `ledger/params.py`: ledger keys, limits, input checks, `LedgerEntry`;
- `ledger/placement.py`: broker set views, where a ledger goes, the order replicas are read in;
- `ledger/calls.py`: `LedgerCalls`, the I/O plumbing (broker calls, master retries, metadata CAS),
  with `ledger/lac.py` for the LAC asked of every replica;
- `ledger/ledgers.py`: `AsyncLedgers`, the operations (create, open, delete, list, metadata);
- `ledger/writer.py`, `ledger/reader.py`: `AsyncWriteHandle`, `AsyncReadHandle`;
- `ledger/recovery_run.py`: the recovery shell around `Recovery`;
- `ledger/sync.py`: `Ledgers(client)` and the sync handles, for a sync `tidelog.client.Client`.

Theory of operation
-------------------
These modules are the I/O shell around the pure cores of `metadata.py` and `recovery.py`: they
talk to the controller's versioned metadata store (every metadata change is a CAS) and to the brokers'
`Ledger` gRPC service, and they decide nothing the cores decide.

- **Create**: check every parameter first (no write before that), place the ledger on a broker
  set (`place_ledger`), take an id from the `ledger-id-counter` key by CAS, store the metadata
  under `ledger/{id:019d}`, then `Ledger.Create` on the set's master. If that fails, the metadata
  is deleted again (best effort) and the error raised.
- **Write** (`AsyncWriteHandle`): ids come from `WriterLedger` (0, 1, 2, …) at call time, adds go
  to the master in batches, one `AddBatch` call each (pipelined, ledger/writer.py), and complete in id order once the master reports AQ
  replicas (rules W1–W3). "Not here / not now" answers are retried on the same entry id after a
  refresh of the master, until the add timeout; a fenced answer fails every pending add with
  LedgerFencedError; any other failure fails that add and every later pending one, and the
  handle refuses further adds.
- **Recovery open**: the password is checked against the metadata before anything is sent. Then
  `RecoveryRun` drives `Recovery`: every action it hands back is carried out concurrently
  (fence and read every replica, rewrite through the master, CAS the metadata) and every answer
  fed back, until the core is DONE or ABORTED.
- **Read** (`AsyncReadHandle`): entries up to the LAC known to the handle, from any replica
  (slaves first, then the master), each entry's digest verified; a replica that fails or returns
  a corrupt entry is skipped for the next. The LAC comes from the replicas' `Lac` answers; the
  master's answer is exact, so tidelog readers do not lag one entry behind as BookKeeper's do.

The synchronous classes (`Ledgers`, `WriteHandle`, `ReadHandle`) run these on the sync
`tidelog.client.Client`'s event loop thread (`client.runner`): `Ledgers(client)`. Async code
uses `AsyncLedgers(async_client)`.
"""

from tidelog.ledger.calls import LedgerCalls
from tidelog.ledger.ledgers import AsyncLedgers
from tidelog.ledger.params import (
    COUNTER_KEY,
    DEFAULT_ADD_TIMEOUT,
    LEDGER_KEY_PREFIX,
    MAX_ENTRY_BYTES,
    LedgerEntry,
    check_entry_data,
    check_entry_range,
    ledger_id_of_key,
    ledger_key,
)
from tidelog.ledger.placement import BrokerSetView, ReplicaView, broker_set_views, place_ledger, read_order
from tidelog.ledger.reader import AsyncReadHandle
from tidelog.ledger.recovery_run import fence_outcome, read_outcome
from tidelog.ledger.sync import Ledgers, ReadHandle, WriteHandle
from tidelog.ledger.writer import AsyncWriteHandle

__all__ = [
    "COUNTER_KEY",
    "DEFAULT_ADD_TIMEOUT",
    "LEDGER_KEY_PREFIX",
    "MAX_ENTRY_BYTES",
    "AsyncLedgers",
    "AsyncReadHandle",
    "AsyncWriteHandle",
    "BrokerSetView",
    "LedgerCalls",
    "LedgerEntry",
    "Ledgers",
    "ReadHandle",
    "ReplicaView",
    "WriteHandle",
    "broker_set_views",
    "check_entry_data",
    "check_entry_range",
    "fence_outcome",
    "ledger_id_of_key",
    "ledger_key",
    "place_ledger",
    "read_order",
    "read_outcome",
]
