"""The HA handshake's proofs and the slave's refusal to be cut below its confirm offset, in-process.

- a fake master (no secret) answering a real slave's handshake gets nothing changed in its log,
  whether it speaks the old protocol (an empty epoch list at once) or forges a challenge;
- a master that proves the secret but demands a cut below the slave's confirm offset is refused
  while the election was clean, and followed once the controller says it was unclean;
- the proofs bind every field (Hypothesis).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from hypothesis import given
from hypothesis import strategies as st

from tests.ha.test_streaming import MASTER_ID, SECRET, SLAVE_ID, Pair, batch, open_log, until
from tidelog.ha import auth
from tidelog.ha.protocol import AuthChallenge, AuthHello, HandshakeReply, encode, read_frame
from tidelog.ha.slave import HaSlave


def _slave_log_with_confirmed_data(path):  # type: ignore[no-untyped-def]
    slog = open_log(path)
    slog.epochs.append(1, 0)
    slog.append(batch(20, "acked"))
    slog.confirm_offset = slog.max_offset  # every in-sync replica held it
    return slog


def test_a_fake_master_changes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def run(answer: str) -> tuple[int, list, int]:
        slog = _slave_log_with_confirmed_data(tmp_path / answer)
        before = slog.max_offset

        async def fake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                hello = await read_frame(reader)
                assert isinstance(hello, AuthHello)
                if answer == "old-protocol":  # "no epoch in common": discard everything
                    writer.write(encode(HandshakeReply(MASTER_ID, 9, 0, 0, ())))
                else:
                    writer.write(encode(AuthChallenge(MASTER_ID, 9, os.urandom(16), os.urandom(32))))
                await writer.drain()
                await asyncio.sleep(1)
            writer.close()

        server = await asyncio.start_server(fake, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        slave = HaSlave(
            slog,
            broker_set="bs",
            broker_id=SLAVE_ID,
            master_id=MASTER_ID,
            master_address=address,
            master_epoch=9,
            idle_timeout_ms=500,
            retry_ms=50,
            secret=SECRET,
        ).start()
        await asyncio.sleep(1.0)
        await slave.stop()
        server.close()
        after, truncations, handshakes = slog.max_offset, slave.truncations, slave.handshakes
        slog.close()
        assert after == before
        return after, truncations, handshakes

    for answer in ("old-protocol", "forged-challenge"):
        _, truncations, handshakes = asyncio.run(run(answer))
        assert truncations == [] and handshakes == 0


def test_a_cut_below_the_confirm_offset_needs_an_unclean_election(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        pair = Pair(tmp_path, 2, frozenset({MASTER_ID}))
        pair.slog.close()
        pair.slog = _slave_log_with_confirmed_data(tmp_path / "s")
        confirmed = pair.slog.max_offset
        await pair.start_master()  # a different history: epoch 2 from offset 0, nothing in common
        end = pair.append(batch(5, "other"))
        try:
            slave = pair.start_slave()
            await until(lambda: slave.refusals >= 2, what="the slave to refuse the cut")
            assert pair.slog.max_offset == confirmed and slave.truncations == []
            await slave.stop()
            # an unclean election this replica's history already includes (epoch 1) changes nothing
            lived = HaSlave(
                pair.slog,
                broker_set="bs",
                broker_id=SLAVE_ID,
                master_id=MASTER_ID,
                master_address=pair.address,
                master_epoch=2,
                ack_interval_ms=100,
                idle_timeout_ms=2000,
                retry_ms=50,
                secret=SECRET,
                unclean_epoch=1,
            ).start()
            await until(lambda: lived.refusals >= 1, what="a refusal despite an older unclean epoch")
            await lived.stop()
            assert pair.slog.max_offset == confirmed
            # the controller elected uncleanly after this replica's history (epoch 2 > its epoch 1):
            # the loss is the operator's choice, even if a clean election followed
            pair.slave = HaSlave(
                pair.slog,
                broker_set="bs",
                broker_id=SLAVE_ID,
                master_id=MASTER_ID,
                master_address=pair.address,
                master_epoch=2,
                ack_interval_ms=100,
                idle_timeout_ms=2000,
                retry_ms=50,
                secret=SECRET,
                unclean_epoch=2,
            ).start()
            await until(lambda: pair.slog.max_offset == end, what="the unclean repair and catch-up")
            assert pair.slave.truncations == [(confirmed, 0)]
        finally:
            await pair.close()

    asyncio.run(main())


_fields = st.tuples(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=16, max_size=16),
)


@given(_fields, _fields)
def test_proofs_bind_every_field_and_the_side(a, b) -> None:  # type: ignore[no-untyped-def]
    m = auth.master_proof(SECRET, *a)
    assert auth.check_master(SECRET, m, *a)
    assert not auth.check_slave(SECRET, m, *a)  # a master's proof is no slave's proof
    assert not auth.check_master("another-secret", m, *a)
    if a != b:
        assert not auth.check_master(SECRET, m, *b)
