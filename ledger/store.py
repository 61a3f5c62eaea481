"""A replica's own view of its ledgers: the index of ledger records in its commit log, and its fences.

Theory of operation
-------------------
Ledger data are ordinary records of the broker set's commit log, in the reserved topic
`%LEDGER%` (queue 0), so they replicate, survive failover and are truncated by fork repair like
every other record. Three kinds (property `k`):

- CREATE (`c`): the ledger's metadata (JSON) as the master received it at creation. A replica
  that holds it knows the ledger's password hash and ack quorum, and knows its log covers the
  ledger's whole life: entries always come after their CREATE in the log.
- ADD (`a`): an entry from the writer, with the writer's LAC and the cumulative length at write
  time and the writer's digest (properties `l`, `e`, `lac`, `len`, `d`); the body is the data.
- RADD (`r`): the same for an entry written again by a recovery.
- CLOSE (`x`): the ledger is CLOSED in the controller's metadata at entry `last` (length
  `len`). The master appends it only after reading that metadata itself (`Ledger.Close`), so it
  never says more than the controller does. From it on, the master refuses the writer's adds
  (LedgerClosedError) and recovery adds beyond `last`; the LAC it carries is `last`.

**Fences.** A replica fences a ledger by recording, durably and before it answers, the offset its
log ended at: the *fence offset* F, kept beside the commit log (a slave's log is a byte copy of
its master's, so it cannot hold a record of its own): `ledger-fences.json` holds every fence as of
its last rewrite, and a fence since is one line appended to `ledger-fences.log` and fdatasync'ed
(`<ledger id> <F> <CRC32C of the two>`), so a fence costs one small append however many ledgers
are fenced (rewriting the whole file took 0.26 s at 100,000 fences, 4 s at 1,000,000). The file is
rewritten, and the journal emptied, once the journal holds as many lines as the file holds fences
(at least 1,024), and at every prune or lowering, which rewrite it anyway. At open the journal's lines
are applied over the file taking the lower F (an F only goes down, so a line that a rewrite
already covered before a crash kept it from emptying the journal changes nothing, or brings back
the fence of a deleted ledger, which protects nothing and is pruned again); a torn last line (no newline: an append that never finished, so a fence
never answered) is cut off, and any other damage refuses the open. The rule that makes
fencing hold on a physical log (`entry_visible`): an ADD at or beyond F reached this replica after
the fence and is **not an entry here**; RADDs always are. This is BookKeeper's "a fenced bookie
refuses the writer's adds", without refusing bytes of the replication stream. F only goes down:
a truncation below it lowers it (before the records go, through the commit log's truncate
listener), and so does reopening a log whose unflushed tail was lost; otherwise records that
arrive later at the same offsets would count as written before the fence.

**What a replica knows.** An entry is *absent* here (no-such-entry) only if this replica holds
the ledger's CREATE record, retention has not removed it, and no visible record of the entry
exists. Everything else it cannot tell (no CREATE yet, below retention, unreadable) is an error,
never an absence: that is what keeps recovery from closing a ledger short (RULES.md R6).

The index is folded lazily from the `%LEDGER%` consume queue (which is itself persisted and
rebuilt after a crash like every consume queue), up to the end of the log, confirmed or not:
recovery must see what a replica holds, and the readers' limit is the LAC, not the offset.
"""

from __future__ import annotations

import binascii
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.commitlog import CommitLog, Message, Placement
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.epochs import atomic_write, fsync_dir
from tidelog.commitlog.record import pack_value_length, property_name_field
from tidelog.dataport_frames import LedgerEntry
from tidelog.errors import CorruptRecordError, TidelogError
from tidelog.ledger.metadata import LedgerMetadata
from tidelog.private import open_private

log = logging.getLogger(__name__)

LEDGER_TOPIC = "%LEDGER%"
FLAG_LEDGER = 2
KIND_CREATE = "c"
KIND_ADD = "a"
KIND_RECOVERY_ADD = "r"
KIND_CLOSE = "x"
FENCES_FILE = "ledger-fences.json"
FENCES_JOURNAL = "ledger-fences.log"
MIN_JOURNAL_LINES = 1024  # the journal is folded into the file at max(this, fences the file holds)

__all__ = [
    "FENCES_FILE",
    "FENCES_JOURNAL",
    "LEDGER_TOPIC",
    "IndexedEntry",
    "LedgerIndex",
    "LedgerView",
    "add_message",
    "add_properties",
    "close_message",
    "create_message",
    "entry_visible",
]


def create_message(meta: LedgerMetadata) -> Message:
    return Message(
        LEDGER_TOPIC,
        0,
        meta.encode(),
        properties={"k": KIND_CREATE, "l": str(meta.ledger_id)},
        flags=FLAG_LEDGER,
    )


def add_message(ledger_id: int, entry: LedgerEntry, kind: str = KIND_ADD) -> Message:
    """An add record (`kind` KIND_ADD, or KIND_RECOVERY_ADD for a recovery's rewrite)."""
    return Message(
        LEDGER_TOPIC,
        0,
        entry.data,
        flags=FLAG_LEDGER,
        encoded_properties=add_properties(
            kind, ledger_id, entry.entry_id, entry.lac, entry.length, entry.digest
        ),
    )


_KIND_FIELD = {
    k: property_name_field("k") + pack_value_length(1) + k.encode() for k in (KIND_ADD, KIND_RECOVERY_ADD)
}
_L, _E, _LAC, _LEN, _D = (property_name_field(n) for n in ("l", "e", "lac", "len", "d"))


def add_properties(kind: str, ledger_id: int, entry_id: int, lac: int, length: int, digest: bytes) -> bytes:
    """An add record's properties block: the layout `encode_properties` gives the dict
    {"k": kind, "l": ledger id, "e": entry id, "lac": …, "len": …, "d": digest in hex}, which is what
    is read back (`LedgerIndex._apply`), built in one step: every entry of a batch pays for it."""
    pack = pack_value_length
    lid, eid, a, n, d = (
        b"%d" % ledger_id,
        b"%d" % entry_id,
        b"%d" % lac,
        b"%d" % length,
        binascii.hexlify(digest),
    )
    return b"".join(
        (
            _KIND_FIELD[kind],
            _L, pack(len(lid)), lid,
            _E, pack(len(eid)), eid,
            _LAC, pack(len(a)), a,
            _LEN, pack(len(n)), n,
            _D, pack(len(d)), d,
        )
    )  # fmt: skip


def close_message(ledger_id: int, last_entry_id: int, length: int) -> Message:
    return Message(
        LEDGER_TOPIC,
        0,
        b"",
        flags=FLAG_LEDGER,
        properties={"k": KIND_CLOSE, "l": str(ledger_id), "last": str(last_entry_id), "len": str(length)},
    )


def entry_visible(kind: str, offset: int, fence_offset: int | None) -> bool:
    """Whether a record is an entry on this replica: a writer's add only if it arrived before the fence."""
    return kind == KIND_RECOVERY_ADD or fence_offset is None or offset < fence_offset


@dataclass(frozen=True, slots=True)
class IndexedEntry:
    offset: int
    size: int
    lac: int
    length: int
    digest: bytes


@dataclass
class LedgerView:
    """What this replica's log says about one ledger."""

    ledger_id: int
    create_offset: int
    metadata: LedgerMetadata  # as created (state OPEN): password hash, quorums, replicas
    entries: dict[int, IndexedEntry] = field(default_factory=dict)
    carried_lac: int = -1  # the largest LAC a visible entry carries (or the CLOSE record)
    last_entry: int = -1  # the largest visible entry id
    closed_at: int | None = None  # the last entry id of a CLOSE record, if this replica holds one
    closed_length: int = 0
    close_end: int = 0  # where the CLOSE record ends in the log

    def confirmed_point(self, extra_lac: int = -1) -> tuple[int, int]:
        """(LAC, length through it) this replica can vouch for.

        Every entry up to a carried (or, on the master, acknowledged) LAC was acknowledged, so
        any visible entry at or below it is too; answering the largest one held here keeps the
        length exact rather than guessed."""
        lac = max(self.carried_lac, extra_lac)
        best = -1
        for e in range(min(lac, self.last_entry), -1, -1):
            if e in self.entries:
                best = e
                break
        return best, (self.entries[best].length if best >= 0 else 0)


def _fence_record(ledger_id: int, offset: int) -> bytes:
    """A journal line: `<ledger id> <fence offset> <CRC32C of the first two, 8 hex digits>`."""
    head = b"%d %d" % (ledger_id, offset)
    return head + b" %08x\n" % crc32c(head)


def _fence_line(line: bytes) -> tuple[int, int] | None:
    """(ledger id, fence offset) of a journal line without its newline; None if it is not intact."""
    parts = line.split(b" ")
    if len(parts) != 3 or not all(p.isdigit() for p in parts[:2]) or len(parts[2]) != 8:
        return None
    try:
        crc = int(parts[2], 16)
    except ValueError:
        return None
    if crc32c(parts[0] + b" " + parts[1]) != crc:
        return None
    return int(parts[0]), int(parts[1])


class LedgerIndex:
    """One replica's ledger index and fences, over its commit log."""

    def __init__(self, commitlog: CommitLog) -> None:
        self.log = commitlog
        self._path = os.path.join(commitlog.directory, FENCES_FILE)
        self._journal = os.path.join(commitlog.directory, FENCES_JOURNAL)
        self._journal_lines = 0
        # the fence files' writers, serialised: a fence is made durable off the event loop
        # (`persist_fence`), beside the rewrites of a prune or a truncation
        self._writes = threading.RLock()
        self._fences: dict[int, int] = self._load_fences()
        self._filed = len(self._fences)  # fences the file holds, as of its last rewrite
        self._replay_journal()
        self._views: dict[int, LedgerView] = {}
        self._applied = 0  # next queue offset of %LEDGER%/0 to fold in
        commitlog.truncate_listeners.append(self._on_truncate)
        # A crash can lose an unflushed tail that a fence offset was taken beyond.
        end = commitlog.max_offset
        if any(f > end for f in self._fences.values()):
            self._fences = {lid: min(f, end) for lid, f in self._fences.items()}
            self._save_fences()

    # --- fences ---------------------------------------------------------------------------

    def _load_fences(self) -> dict[int, int]:
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            return {int(k): int(v) for k, v in doc["fences"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Forgetting fences could let a deposed writer's adds count again: refuse to start.
            raise CorruptRecordError(self._path, 0, f"unreadable ledger fences file: {exc}") from None

    def _replay_journal(self) -> None:
        try:
            with open(self._journal, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        at = 0
        while at < len(raw):
            end = raw.find(b"\n", at)
            parsed = _fence_line(raw[at:end]) if end >= 0 else None
            if parsed is None:
                if end < 0:
                    # the last append never finished (so its fence was never answered): cut it off,
                    # or the next append would leave it in the middle. A whole line that fails
                    # its CRC is damage, not a torn append: refused below like any other.
                    log.warning("cutting a torn last line off %s at byte %d", self._journal, at)
                    fd = open_private(self._journal, os.O_WRONLY)
                    try:
                        os.ftruncate(fd, at)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    return
                # Forgetting fences could let a deposed writer's adds count again: refuse to start.
                raise CorruptRecordError(self._journal, at, "unreadable line in the ledger fences journal")
            lid, offset = parsed
            self._fences[lid] = min(offset, self._fences.get(lid, offset))
            self._journal_lines += 1
            at = end + 1

    def _save_fences(self) -> None:
        """Rewrite the file with every fence, then empty the journal (a crash in between leaves
        lines the file covers: replaying them changes nothing)."""
        with self._writes:  # reentrant: `persist_fence` calls this holding it
            doc = {"fences": {str(k): v for k, v in sorted(self._fences.items())}}
            atomic_write(self._path, json.dumps(doc, separators=(",", ":")).encode())
            self._filed = len(self._fences)
            if self._journal_lines or os.path.exists(self._journal):
                fd = open_private(self._journal, os.O_WRONLY | os.O_CREAT)
                try:
                    os.ftruncate(fd, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._journal_lines = 0

    def _append_fence(self, ledger_id: int, offset: int) -> None:
        """One fence, durable on return: a line appended to the journal and fdatasync'ed."""
        created = not os.path.exists(self._journal)
        fd = open_private(self._journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, _fence_record(ledger_id, offset))
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(os.path.dirname(self._journal) or ".")  # the new file's name is durable too
        self._journal_lines += 1

    def fence(self, ledger_id: int) -> bool:
        """Fence `ledger_id` here, durably, at the current end of the log; False if it already was."""
        if not self.mark_fenced(ledger_id):
            return False
        self.persist_fence(ledger_id)
        return True

    def mark_fenced(self, ledger_id: int) -> bool:
        """Fence `ledger_id` in memory at the current end of the log (adds are judged against it
        from now on); False if it already was. Nobody may be told of the fence before
        `persist_fence` has returned."""
        if ledger_id in self._fences:
            return False
        self._fences[ledger_id] = self.log.max_offset
        return True

    def persist_fence(self, ledger_id: int) -> None:
        """Make the fence `mark_fenced` set durable: an fdatasync'ed line in the journal, or a
        rewrite of the file. Safe from any thread (a broker runs it off its event loop)."""
        with self._writes:
            offset = self._fences.get(ledger_id)
            if offset is None:
                return  # pruned meanwhile (its ledger deleted): nothing to keep
            if self._journal_lines >= max(MIN_JOURNAL_LINES, self._filed):
                self._save_fences()  # amortised: a rewrite of n fences comes after n appends at least
            else:
                self._append_fence(ledger_id, offset)
        log.info("fenced ledger %d at offset %d in %s", ledger_id, offset, self.log.directory)

    def is_fenced(self, ledger_id: int) -> bool:
        return ledger_id in self._fences

    def fenced_ledgers(self) -> list[int]:
        return sorted(self._fences)

    def prune_fences(self, dead: set[int]) -> list[int]:
        """Forget the fences of ledgers the controller no longer has (deleted ones): nobody can
        open or write them again, so their fences protect nothing. Returns the ids dropped."""
        gone = sorted(lid for lid in self._fences if lid in dead)
        if gone:
            self._fences = {lid: f for lid, f in self._fences.items() if lid not in dead}
            self._save_fences()
            log.info("pruned the fences of deleted ledgers %s in %s", gone, self.log.directory)
        return gone

    def _on_truncate(self, cut: int) -> None:
        lowered = {lid: min(f, cut) for lid, f in self._fences.items()}
        if lowered != self._fences:
            self._fences = lowered
            self._save_fences()
        self._views.clear()
        self._applied = 0

    # --- the index ------------------------------------------------------------------------

    def refresh(self) -> None:
        """Fold in every %LEDGER% record appended since the last call."""
        for m in self.log.tail(LEDGER_TOPIC, 0, self._applied):
            self._apply(m.properties, m.phys_offset, m.size, m.body)
            self._applied = m.queue_offset + 1

    def note_appended(self, placement: Placement, message: Message) -> None:
        """Fold a record this replica has just appended, without reading it back from the log."""
        if placement.queue_offset != self._applied:  # earlier records not folded yet: read them all
            self.refresh()
            return
        self._apply(message.properties or {}, placement.phys_offset, placement.size, message.body)
        self._applied += 1

    def note_adds(
        self, ledger_id: int, kind: str, placements: Sequence[Placement], entries: Sequence[LedgerEntry]
    ) -> None:
        """Fold the add records of `entries` this replica has just appended (`add_message`), from
        the entries themselves: reading their properties back costs more than writing them."""
        if not placements or placements[0].queue_offset != self._applied:
            self.refresh()  # earlier records not folded yet: read them all
            return
        view = self._views.get(ledger_id)
        if view is not None:
            for p, e in zip(placements, entries, strict=True):
                self._add_entry(view, kind, e.entry_id, e.lac, e.length, e.digest, p.phys_offset, p.size)
        self._applied += len(placements)

    def _apply(self, props: Mapping[str, str], offset: int, size: int, body: bytes) -> None:
        try:
            kind = props["k"]
            ledger_id = int(props["l"])
            if kind == KIND_CREATE:
                if ledger_id not in self._views:
                    meta = LedgerMetadata.decode(body)
                    self._views[ledger_id] = LedgerView(ledger_id, offset, meta)
                return
            if kind == KIND_CLOSE:
                self._apply_close(ledger_id, int(props["last"]), int(props["len"]), offset + size)
                return
            entry_id, lac, length = int(props["e"]), int(props["lac"]), int(props["len"])
            digest = bytes.fromhex(props["d"])
        except (KeyError, ValueError, TidelogError) as exc:
            log.error("ignoring a malformed ledger record at offset %d: %s", offset, exc)
            return
        view = self._views.get(ledger_id)
        if view is not None:  # else no CREATE here (below retention): an unknown ledger
            self._add_entry(view, kind, entry_id, lac, length, digest, offset, size)

    def _add_entry(
        self,
        view: LedgerView,
        kind: str,
        entry_id: int,
        lac: int,
        length: int,
        digest: bytes,
        offset: int,
        size: int,
    ) -> None:
        if entry_id in view.entries:
            return  # a duplicate of a held entry
        if not entry_visible(kind, offset, self._fences.get(view.ledger_id)):
            return
        view.entries[entry_id] = IndexedEntry(offset, size, lac, length, digest)
        if lac > view.carried_lac:
            view.carried_lac = lac
        if entry_id > view.last_entry:
            view.last_entry = entry_id

    def _apply_close(self, ledger_id: int, last: int, length: int, end: int) -> None:
        view = self._views.get(ledger_id)
        if view is None or view.closed_at is not None:
            return  # unknown here (below retention), or a repeated close: the first one holds
        view.closed_at, view.closed_length, view.close_end = last, length, end
        # every entry up to the metadata's end was acknowledged, or rewritten by a recovery
        view.carried_lac = max(view.carried_lac, last)

    def ledger_starts(self) -> dict[int, int]:
        """Each ledger this replica knows: where its CREATE record is (its first record here)."""
        self.refresh()
        return {lid: v.create_offset for lid, v in self._views.items()}

    def view(self, ledger_id: int) -> LedgerView | None:
        self.refresh()
        return self._views.get(ledger_id)

    def knows_whole_life(self, view: LedgerView) -> bool:
        """True when this replica can say "never had it" for entries of the ledger."""
        return view.create_offset >= self.log.min_offset

    def read_entry(self, entry: IndexedEntry) -> bytes:
        """The data of an indexed entry (CRC-checked by the commit log)."""
        return self.log.read_at(entry.offset).body
