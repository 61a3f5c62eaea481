"""Re-replication of ledgers (ReplaceLedgerReplicas, RULES.md PL8): a broker that left its set is
replaced, in the ensembles of the listed ledgers, by one in the set's SyncStateSet.

Authorised by the cluster secret (a signed operator call), not by the ledgers' passwords: the
replicas are the broker set's, and only which broker ids hold the entries changes (ledger/RULES.md
M7), never the entries or the ledger's state. Where data must be held is decided by
``placement.py``; this module only applies a planned repair, checked again at apply time.
"""

from __future__ import annotations

from tidelog.errors import TidelogError
from tidelog.ledger.metadata import LedgerMetadata, check_update

from .commands import ReplaceLedgerReplicas, Result
from .model import LEDGER_KEY_PREFIX, BrokerSet, MetaEntry, StateData
from .validation import Outcome, Reject, bad, need_meta_key, need_name, need_nonneg

Pairs = tuple[tuple[int, int], ...]


def _check_args(s: StateData, c: ReplaceLedgerReplicas) -> BrokerSet:
    """The broker set to repair, once the command's shape checked out."""
    need_name(c.broker_set, "broker set name")
    need_nonneg(c.now_ms, "now_ms")
    if not isinstance(c.repairs, tuple) or not c.repairs:
        raise bad("repairs must name at least one ledger")
    bs = s.broker_sets.get(c.broker_set)
    if bs is None:
        raise Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"broker set {c.broker_set} does not exist")
    keys = [r[0] for r in c.repairs if isinstance(r, tuple) and len(r) == 2]
    if len(set(keys)) != len(keys):
        raise bad("each ledger may be named once in a repair")
    return bs


def _check_repair(bs: BrokerSet, repair: object) -> tuple[str, Pairs]:
    """One (ledger key, ((old, new), ...)) whose every pair PL8 allows."""
    if not isinstance(repair, tuple) or len(repair) != 2:
        raise bad("each repair is (ledger metadata key, ((old, new), ...))")
    key, pairs = repair
    need_meta_key(key)
    if (
        not key.startswith(LEDGER_KEY_PREFIX)
        or not isinstance(pairs, tuple)
        or not pairs
        or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs)
    ):
        raise bad(f"{key!r}: a ledger key and at least one (old, new) pair")
    for old, new in pairs:
        need_nonneg(old, "old broker id")
        need_nonneg(new, "new broker id")
        if old in bs.members:  # PL8: only a broker that left the set is replaced
            raise Reject("PLACEMENT_REFUSED", f"broker {old} is still a member of {bs.name}")
        if new not in bs.sync_state_set:  # PL8: the new one must hold every acknowledged byte
            raise Reject("PLACEMENT_REFUSED", f"broker {new} is not in the SyncStateSet of {bs.name}")
    return key, pairs


def _replaced(cur: MetaEntry, bs: BrokerSet, pairs: Pairs, now_ms: int) -> MetaEntry | None:
    """The entry with the ledger's replicas replaced; None when it names none of them."""
    key = cur.key
    try:
        meta = LedgerMetadata.decode(cur.value)
        new_meta = meta.with_replicas_replaced(dict(pairs))
        check_update(meta, new_meta)
    except TidelogError as err:
        raise Reject(err.code, f"metadata {key}: {err.message}") from None
    if meta.broker_set != bs.name:
        raise bad(f"{key} is a ledger of {meta.broker_set}, not {bs.name}")
    if new_meta == meta:
        return None
    return MetaEntry(key=key, value=new_meta.encode(), version=cur.version + 1, modified_ms=now_ms)


def replace_ledger_replicas(s: StateData, c: ReplaceLedgerReplicas) -> Outcome:
    bs = _check_args(s, c)
    updates = []
    for repair in c.repairs:
        key, pairs = _check_repair(bs, repair)
        cur = s.metadata.get(key)
        if cur is None:
            continue  # deleted since the repair was planned: nothing to re-replicate
        entry = _replaced(cur, bs, pairs, c.now_ms)
        if entry is not None:
            updates.append(entry)
    for e in updates:  # only after every ledger checked out: a refusal changes nothing
        s.metadata[e.key] = e
        s.meta_changes.note(e.key)
    return Result(
        value=[e.key for e in updates],
        changed=bool(updates),
        message=f"{len(updates)} ledger(s) re-replicated",
    ), None
