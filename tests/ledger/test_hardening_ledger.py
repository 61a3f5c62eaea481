"""Raw calls that skip the ledger client, on a cluster started with `tide cluster up`: the brokers
refuse adds to a closed or fenced ledger and adds whose digest does not verify, the controller
refuses ledger metadata changes without the ledger's password, and through all of it a reader
still sees every entry that was written."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from tests.brokers import _typed
from tests.client.conftest import LocalCluster
from tidelog.client import Client
from tidelog.client.controllers import ControllerClient
from tidelog.errors import (
    DigestMatchError,
    LedgerClosedError,
    LedgerFencedError,
    UnauthorizedAccessError,
)
from tidelog.ledger import LedgerMetadata, Ledgers, LedgerState
from tidelog.ledger.client import ledger_key
from tidelog.ledger.digest import Digester
from tidelog.proto import ledger_pb2 as lpb
from tidelog.proto import ledger_pb2_grpc as lpb_grpc

pytestmark = pytest.mark.slow

PASSWORD = b"hardening"
ENTRIES = [b"entry-%d" % i * (i + 1) for i in range(5)]


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers) as c:
        yield c


def _raw_add(
    client: Client,
    meta: LedgerMetadata,
    entry_id: int,
    data: bytes,
    *,
    lac: int,
    length: int,
    digest: bytes | None = None,
    password: bytes = PASSWORD,
) -> Any:
    """One Add to the set's master over raw gRPC; the digest is the right one unless given."""
    if digest is None:
        digest = Digester(meta.digest_type, password).compute(meta.ledger_id, entry_id, lac, length, data)
    address = Ledgers(client).broker_set(meta.broker_set, refresh=True).master_address
    with grpc.insecure_channel(address) as channel:
        try:
            return lpb_grpc.LedgerStub(channel).Add(
                lpb.AddRequest(
                    ledger_id=meta.ledger_id,
                    entry_id=entry_id,
                    password=password,
                    lac=lac,
                    length=length,
                    digest=digest,
                    data=data,
                ),
                timeout=20,
            )
        except grpc.RpcError as exc:
            raise _typed(exc) from None


def _written(client: Client, digest: str = "crc32c", *, close: bool = True) -> Any:
    w = Ledgers(client).create_ledger(2, 2, 2, PASSWORD, digest=digest)
    for data in ENTRIES:
        w.add_entry(data)
    if close:
        w.close()
    return w


def _reads_every_entry(client: Client, ledger_id: int, *, recovery: bool = False) -> None:
    r = Ledgers(client).open_ledger(ledger_id, PASSWORD, recovery=recovery)
    assert r.last_add_confirmed == len(ENTRIES) - 1
    assert [e.data for e in r.read_entries(0, len(ENTRIES) - 1)] == ENTRIES


def test_an_add_to_a_closed_ledger_is_refused_with_or_without_a_valid_digest(client: Client) -> None:
    w = _written(client)
    meta = w.metadata
    length = sum(map(len, ENTRIES))
    with pytest.raises(LedgerClosedError):  # row 8: a bogus digest, accepted before
        _raw_add(client, meta, 5, b"forged", lac=4, length=length + 6, digest=b"\0\0\0\0")
    with pytest.raises(LedgerClosedError):  # and a correct one: the ledger is sealed on the brokers
        _raw_add(client, meta, 5, b"valid", lac=4, length=length + 5)
    with pytest.raises(LedgerClosedError):  # a recovery add beyond the end, too
        address = Ledgers(client).broker_set(meta.broker_set, refresh=True).master_address
        data = b"late"
        digest = Digester(meta.digest_type, PASSWORD).compute(meta.ledger_id, 5, 4, length + 4, data)
        with grpc.insecure_channel(address) as channel:
            try:
                lpb_grpc.LedgerStub(channel).Add(
                    lpb.AddRequest(
                        ledger_id=meta.ledger_id,
                        entry_id=5,
                        password=PASSWORD,
                        lac=4,
                        length=length + 4,
                        digest=digest,
                        data=data,
                        recovery=True,
                    ),
                    timeout=20,
                )
            except grpc.RpcError as exc:
                raise _typed(exc) from None
    _reads_every_entry(client, w.ledger_id)
    _reads_every_entry(client, w.ledger_id, recovery=True)

    # a ledger sealed by a recovery (its writer gone) refuses the writer's adds as fenced
    dead = _written(client, close=False)
    Ledgers(client).open_ledger(dead.ledger_id, PASSWORD, recovery=True)
    for digest in (None, b"bogus"):
        with pytest.raises(LedgerFencedError):
            _raw_add(client, dead.metadata, 5, b"late", lac=4, length=length + 4, digest=digest)
    _reads_every_entry(client, dead.ledger_id)


@pytest.mark.parametrize("digest", ["crc32c", "mac"])
def test_an_add_whose_digest_does_not_verify_is_refused(client: Client, digest: str) -> None:
    w = _written(client, digest, close=False)
    meta = w.metadata
    length = sum(map(len, ENTRIES))
    data = b"next"
    good = Digester(meta.digest_type, PASSWORD).compute(meta.ledger_id, 5, 4, length + len(data), data)
    bad = [
        b"bogus",  # not a digest at all
        bytes([good[0] ^ 1]) + good[1:],  # one bit off
        Digester(meta.digest_type, PASSWORD).compute(
            meta.ledger_id, 5, 4, length, data
        ),  # over another length
        Digester(meta.digest_type, PASSWORD).compute(meta.ledger_id + 1, 5, 4, length + len(data), data),
    ]
    if digest == "mac":  # keyed by another password: only the ledger's password makes a valid MAC
        bad.append(
            Digester(meta.digest_type, b"other").compute(meta.ledger_id, 5, 4, length + len(data), data)
        )
    for d in bad:
        with pytest.raises(DigestMatchError):
            _raw_add(client, meta, 5, data, lac=4, length=length + len(data), digest=d)
    _reads_every_entry(client, w.ledger_id)
    # nothing was stored: the writer's next add takes entry 5 as if nothing happened
    assert w.add_entry(data) == 5
    w.close()


def test_metadata_changes_without_the_password_are_refused(cluster: LocalCluster, client: Client) -> None:
    w = _written(client, close=False)
    key = ledger_key(w.ledger_id)

    async def attack() -> None:
        async with ControllerClient(cluster.controllers) as cc:
            entry = await cc.meta_get(key)
            meta = LedgerMetadata.decode(entry.value)
            empty = replace(meta, state=LedgerState.CLOSED, last_entry_id=-1, length=0)
            # row 8: CLOSED at -1 and deleted without the password, both accepted before
            with pytest.raises(UnauthorizedAccessError):
                await cc.meta_cas(key, empty.encode(), entry.version)
            with pytest.raises(UnauthorizedAccessError):
                await cc.meta_delete(key)
            for password in (b"wrong", b""):
                with pytest.raises(UnauthorizedAccessError):
                    await cc.meta_cas(key, empty.encode(), entry.version, ledger_password=password)
                with pytest.raises(UnauthorizedAccessError):
                    await cc.meta_delete(key, ledger_password=password)
                with pytest.raises(UnauthorizedAccessError):
                    await cc.meta_delete(key, entry.version, ledger_password=password)
            assert (await cc.meta_get(key)).version == entry.version, "nothing changed"

    asyncio.run(attack())
    _reads_every_entry(client, w.ledger_id)  # the ledger is still OPEN with every entry
    w.add_entry(b"more")  # and its writer goes on
    w.close()
    with pytest.raises(UnauthorizedAccessError):
        Ledgers(client).delete_ledger(w.ledger_id, b"wrong")
    Ledgers(client).delete_ledger(w.ledger_id, PASSWORD)
    assert w.ledger_id not in Ledgers(client).list_ledgers()
