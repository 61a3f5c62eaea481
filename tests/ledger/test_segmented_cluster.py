"""SegmentedLog on a real cluster (`tide cluster up`, deploy/local.yaml: one broker set of two
replicas), with owners in separate OS processes.

Run as a script (`python test_segmented_cluster.py worker ...`) this file is also the owner
process of the contention test: it acquires the log, appends entries tagged with its name and a
sequence number, records every acknowledged append in its ack file (one JSON line, flushed, after
`append` returned), and acquires again whenever the other process took the log over.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the script form needs the repository's tests package
    sys.path.insert(0, str(REPO))

from tidelog.client import Client  # noqa: E402
from tidelog.client.aio import AsyncClient  # noqa: E402
from tidelog.errors import LedgerRecoveryError, SegmentedLogOwnershipLostError, TidelogError  # noqa: E402
from tidelog.ledger import (  # noqa: E402
    AsyncSegmentedLog,
    Ledgers,
    LedgerState,
    Position,
    RollPolicy,
    SegmentedLog,
    SegmentedLogRecord,
)
from tidelog.tasks import within  # noqa: E402

PASSWORD = b"seglog-test"


# --- the owner process -------------------------------------------------------------------------


def worker(
    controllers: str, log_name: str, me: str, acks_path: str, rounds: int, per_round: int, pause: float
) -> None:
    """Contend for `log_name`: `rounds` times acquire and append up to `per_round` entries."""
    seq = 0
    rng = random.Random(me)
    with open(acks_path, "a", encoding="utf-8") as acks, Client(controllers) as client:
        log = SegmentedLog(
            client,
            log_name,
            password=PASSWORD,
            ensemble_size=2,
            ack_quorum=2,
            roll=RollPolicy(max_entries=3, max_bytes=None, max_age_s=None),
            owner=me,
        )
        for round_no in range(rounds):
            for attempt in range(30):
                try:
                    rec = log.acquire()
                    break
                except LedgerRecoveryError:  # retryable: the other owner's ledger was mid-change
                    time.sleep(0.1 * (attempt + 1))
            else:
                raise SystemExit(f"{me}: could not acquire {log_name}")
            acks.write(
                json.dumps({"event": "acquired", "generation": rec.generation, "round": round_no}) + "\n"
            )
            for _ in range(per_round):
                data = f"{me}:{seq}"
                t0 = time.monotonic()
                seq += 1
                try:
                    position = log.append(data.encode())
                except SegmentedLogOwnershipLostError:
                    acks.write(json.dumps({"event": "lost", "data": data, "round": round_no}) + "\n")
                    acks.flush()
                    break
                acks.write(
                    json.dumps(
                        {
                            "event": "ack",
                            "ledger": position.ledger_id,
                            "entry": position.entry_id,
                            "data": data,
                            "t": round(time.monotonic() - t0, 4),
                        }
                    )
                    + "\n"
                )
                acks.flush()
                time.sleep(pause)
            time.sleep(rng.uniform(0.2, 0.8))  # let the other owner write a while before taking over
        with contextlib.suppress(SegmentedLogOwnershipLostError):  # taken over after its last append
            log.release()


# --- tests -------------------------------------------------------------------------------------


def _read_acks(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_owners(cluster, tmp_path: Path) -> dict[str, Path]:
    """Run the two owner processes to the end (each must exit 0); their ack files, by owner."""
    procs = {}
    for me in ("alpha", "beta"):
        acks = tmp_path / f"{me}.acks"
        procs[me] = (
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "worker",
                    cluster.controllers,
                    "contended",
                    me,
                    str(acks),
                    "8",
                    "12",
                    "0.03",
                ],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
            acks,
        )
    try:
        for me, (proc, _) in procs.items():
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"{me} exited {proc.returncode}:\n{out[-4000:]}"
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {me: acks for me, (_, acks) in procs.items()}


def _seal_and_read(cluster) -> tuple[SegmentedLogRecord, list, dict]:
    """A last acquire seals the log; then its record, every entry, and each ledger's state."""
    with Client(cluster.controllers) as client:
        checker = SegmentedLog(client, "contended", password=PASSWORD, ensemble_size=2)
        checker.acquire()  # seals whatever the last owner left open
        checker.release()
        record = checker.record()
        log = list(checker.entries())
        states = {lid: Ledgers(client).get_metadata(lid).state for lid in record.ledgers}
    return record, log, states


def _check_log_holds_the_acks(
    events: dict[str, list[dict]], log: list, states: dict
) -> tuple[list[tuple[str, Position, str]], dict[int, set[str]]]:
    """Every ack is in the log where its owner was told, once; one owner per ledger; each owner's
    entries in order; every ledger closed; positions ascending. Returns the acks and the owners by ledger."""
    at = {e.position: e.data.decode() for e in log}
    acked = [
        (me, Position(e["ledger"], e["entry"]), e["data"])
        for me, evs in events.items()
        for e in evs
        if e["event"] == "ack"
    ]
    missing = [(me, p, d) for me, p, d in acked if at.get(p) != d]
    assert not missing, f"acknowledged appends not in the log: {missing[:10]}"
    datas = [e.data.decode() for e in log]
    assert len(datas) == len(set(datas)), "an entry appears twice"
    owners_of = collections.defaultdict(set)
    for e in log:
        owners_of[e.position.ledger_id].add(e.data.decode().split(":")[0])
    assert all(len(o) == 1 for o in owners_of.values()), dict(owners_of)
    for me in events:
        seqs = [int(d.split(":")[1]) for d in datas if d.startswith(me + ":")]
        assert seqs == sorted(seqs)
    assert all(s is LedgerState.CLOSED for s in states.values())
    assert [e.position for e in log] == sorted(e.position for e in log)
    return acked, owners_of


def _check_the_owners_contended(
    events: dict[str, list[dict]],
    record: SegmentedLogRecord,
    acked: list[tuple[str, Position, str]],
    owners_of: dict[int, set[str]],
) -> None:
    """The owners were fenced mid-round, never shared a generation, both appended, across ledgers."""
    # the test means something only if owners were fenced while writing and ledgers rolled
    lost = sum(1 for evs in events.values() for e in evs if e["event"] == "lost")
    assert lost >= 1, "no owner was ever fenced mid-round: the processes did not contend"
    # no two owners ever held the same generation, and the log's record is past all of them
    holders = collections.defaultdict(set)
    for me, evs in events.items():
        for e in evs:
            if e["event"] == "acquired":
                holders[e["generation"]].add(me)
    assert holders and all(len(h) == 1 for h in holders.values()), dict(holders)
    assert record.generation > max(holders)  # the checker's acquire came last
    for me in events:
        assert any(who == me for who, _, _ in acked), f"{me} never appended: nothing to interleave"
    assert len(owners_of) >= 3  # entries in several ledgers, of both owners


@pytest.mark.slow
def test_two_processes_contending_for_a_log_lose_no_ack_and_never_share_a_ledger(cluster, tmp_path):
    """Two owner processes take the log from each other again and again. Afterwards (a last
    acquire seals the log) the log read across ledgers holds every acknowledged append at the
    position its owner was told; no ledger holds entries of both owners; each owner's entries are
    in the order it sent them; and the takeovers really fenced a writer mid-round."""
    ack_files = _run_owners(cluster, tmp_path)
    events = {me: _read_acks(acks) for me, acks in ack_files.items()}
    record, log, states = _seal_and_read(cluster)
    acked, owners_of = _check_log_holds_the_acks(events, log, states)
    _check_the_owners_contended(events, record, acked, owners_of)


@pytest.mark.slow
def test_a_follower_reads_across_rolls_while_the_owner_appends(cluster):
    """An owner rolls every 3 entries while a follower (entries(follow=True)) reads: it sees the
    appends in order, byte for byte, across ledger boundaries, and only confirmed ones."""

    async def go() -> tuple[list[Position], list[tuple[Position, bytes]], list[tuple[Position, bytes]]]:
        async with AsyncClient(cluster.controllers) as client:
            owner = AsyncSegmentedLog(
                client,
                "followed",
                password=PASSWORD,
                ensemble_size=2,
                roll=RollPolicy(max_entries=3, max_bytes=None, max_age_s=None),
            )
            follower = AsyncSegmentedLog(client, "followed", password=PASSWORD, ensemble_size=2)
            await owner.acquire()
            payloads = [os.urandom(40) + b"%d" % i for i in range(10)]
            seen: list[tuple[Position, bytes]] = []

            async def follow() -> None:
                async for entry in follower.entries(follow=True, poll_timeout=0.5):
                    seen.append((entry.position, entry.data))
                    if len(seen) == len(payloads):
                        return

            task = asyncio.create_task(follow())
            positions = []
            for p in payloads:
                positions.append(await owner.append(p))
                await asyncio.sleep(0.02)
            await within(task, 30)
            await owner.close()
            await follower.close()
            return positions, list(zip(positions, payloads, strict=True)), seen

    positions, written, seen = asyncio.run(go())
    assert len({p.ledger_id for p in positions}) == 4
    assert seen == written


@pytest.mark.slow
def test_a_lost_owner_fails_with_a_typed_error_and_its_acks_survive(cluster):
    """In one process, for the exact error: A appends, B acquires (recovering A's ledger), A's next
    append raises SegmentedLogOwnershipLostError caused by the fence, and A's acked entries are
    first in the log."""
    with Client(cluster.controllers) as client:
        a = SegmentedLog(client, "fenced", password=PASSWORD, ensemble_size=2)
        b = SegmentedLog(client, "fenced", password=PASSWORD, ensemble_size=2)
        a.acquire()
        acked = [a.append(b"a%d" % i) for i in range(3)]
        b.acquire()
        with pytest.raises(SegmentedLogOwnershipLostError) as info:
            a.append(b"after")
        assert isinstance(info.value.__cause__, TidelogError)
        assert info.value.__cause__.code in ("LEDGER_FENCED", "LEDGER_CLOSED")
        with pytest.raises(SegmentedLogOwnershipLostError):
            a.append(b"again")
        pb = b.append(b"b0")
        b.release()
        got = [(e.position, e.data) for e in a.entries()]
    assert got[:3] == [(p, b"a%d" % i) for i, p in enumerate(acked)]
    assert got[-1] == (pb, b"b0") and b"again" not in [d for _, d in got]


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "worker":
        _, _, controllers, name, me, acks_path, rounds, per_round, pause = sys.argv
        worker(controllers, name, me, acks_path, int(rounds), int(per_round), float(pause))
    else:
        raise SystemExit(
            "usage: test_segmented_cluster.py worker CONTROLLERS LOG NAME ACKS ROUNDS PER_ROUND PAUSE"
        )
