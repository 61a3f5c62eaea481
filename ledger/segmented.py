"""`SegmentedLog`: an unbounded log made of ledgers, owned by one writer at a time (a managed ledger).

Theory of operation
-------------------
A segmented log is a list of ledgers kept in ONE record of the controller's metadata store, under
`seglog/<name>`: the ledger ids in order, the owner's token and a generation (bumped by every
`acquire`). Every change of the record is a compare-and-set on its version, so two writers can
never both believe they appended the same ledger to the list.

- `acquire()`: read the record; if its last ledger is not CLOSED, recover it (a recovery open
  fences it on the replicas and closes it where its acknowledged entries end); create a new
  ledger; CAS the record appending that ledger with generation + 1 and our token. A lost CAS
  deletes the new ledger and starts over. Only then does `append` work.
- `append(data) -> Position`: add to the current ledger. Before an add, `should_roll` decides
  (size, entry count or age) whether to seal the current ledger and move to a new one: wait for
  the adds in flight, close the ledger (its end is its LAC), create a new one, CAS it onto the
  list (the CAS names the owner and generation it expects, so a roll cannot revive a lost
  ownership).
- Fencing is what makes ownership exclusive. A new owner's acquire recovers the old owner's
  ledger, so the old owner's next add fails with LedgerFencedError (or LedgerClosedError) and it
  raises `SegmentedLogOwnershipLostError`: it never moves on silently. A ledger has exactly one
  writer (the handle that created it), so no ledger ever holds two owners' entries, and every
  ledger in the list but the last is CLOSED (the owner closes before it CASes a new one on).
- Readers address entries by `Position(ledger_id, entry_id)` and read across ledgers in list
  order: a CLOSED ledger up to its last entry id, the last (open) ledger up to its LAC, through a
  non-recovery open that fences nothing. A reader never sees an entry a recovery could drop.

The pure parts are plain functions: the record and its deterministic JSON, the record changes
of acquire and roll (`ledger/seglog_record.py`), the roll decision with the time passed in
(`ledger/seglog_rolling.py`), the walk from a position over the list (`ledger/seglog_plan.py`).
The classes only do I/O: `AsyncSegmentedLog` (`ledger/seglog.py`), its reading side
`SegmentReader` (`ledger/seglog_reader.py`) and the sync `SegmentedLog` (`ledger/sync.py`). This
module is the one place to import them from. Ledger ids come from a counter and a ledger is only
appended after reading a record that holds every earlier one, so ids increase along the list;
`SegmentedLogRecord` refuses a list that does not, and positions order like the list.
"""

from tidelog.ledger.seglog import AsyncSegmentedLog
from tidelog.ledger.seglog_plan import LedgerEnd, ReadPlan, Span, locate, plan_read
from tidelog.ledger.seglog_reader import SegmentReader
from tidelog.ledger.seglog_record import (
    KEY_PREFIX,
    RECORD_FORMAT,
    START,
    LogEntry,
    Position,
    SegmentedLogRecord,
    acquired_record,
    cas_applied,
    check_log_name,
    check_position,
    record_key,
    rolled_record,
)
from tidelog.ledger.seglog_rolling import (
    RollPolicy,
    choose_ensemble_size,
    default_ensemble_size,
    default_owner,
    should_roll,
)
from tidelog.ledger.sync import SegmentedLog

__all__ = [
    "KEY_PREFIX",
    "RECORD_FORMAT",
    "START",
    "AsyncSegmentedLog",
    "LedgerEnd",
    "LogEntry",
    "Position",
    "ReadPlan",
    "RollPolicy",
    "SegmentReader",
    "SegmentedLog",
    "SegmentedLogRecord",
    "Span",
    "acquired_record",
    "cas_applied",
    "check_log_name",
    "check_position",
    "choose_ensemble_size",
    "default_ensemble_size",
    "default_owner",
    "locate",
    "plan_read",
    "record_key",
    "rolled_record",
    "should_roll",
]
