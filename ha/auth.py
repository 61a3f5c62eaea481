"""The HA handshake's mutual proof of the cluster secret (pure: fields in, proofs out).

A slave opens with `AuthHello` (its broker set, id and a fresh nonce); the master answers
`AuthChallenge` with its own nonce and `master_proof`; the slave checks it and answers `AuthProof`
with `slave_proof`. Both proofs cover the broker set, both broker ids, the master's epoch and
both nonces, under different purposes, so that neither side's proof can be replayed as the
other's, on another connection, for another broker or another term. See ha/protocol.py for the
frames and docs/reference/rocketmq-controller-ha.md §3.4 for the handshake that follows.
"""

from __future__ import annotations

from tidelog.clusterauth import prove, verify

MASTER_PURPOSE = "tidelog-ha-master-v1"
SLAVE_PURPOSE = "tidelog-ha-slave-v1"


def _fields(
    broker_set: str, master_id: int, slave_id: int, master_epoch: int, slave_nonce: bytes, master_nonce: bytes
) -> tuple[str, int, int, int, bytes, bytes]:
    return (broker_set, master_id, slave_id, master_epoch, slave_nonce, master_nonce)


def master_proof(
    secret: str,
    broker_set: str,
    master_id: int,
    slave_id: int,
    master_epoch: int,
    slave_nonce: bytes,
    master_nonce: bytes,
) -> bytes:
    return prove(
        secret,
        MASTER_PURPOSE,
        *_fields(broker_set, master_id, slave_id, master_epoch, slave_nonce, master_nonce),
    )


def slave_proof(
    secret: str,
    broker_set: str,
    master_id: int,
    slave_id: int,
    master_epoch: int,
    slave_nonce: bytes,
    master_nonce: bytes,
) -> bytes:
    return prove(
        secret,
        SLAVE_PURPOSE,
        *_fields(broker_set, master_id, slave_id, master_epoch, slave_nonce, master_nonce),
    )


def check_master(
    secret: str,
    proof: bytes,
    broker_set: str,
    master_id: int,
    slave_id: int,
    master_epoch: int,
    slave_nonce: bytes,
    master_nonce: bytes,
) -> bool:
    return verify(
        secret,
        proof,
        MASTER_PURPOSE,
        *_fields(broker_set, master_id, slave_id, master_epoch, slave_nonce, master_nonce),
    )


def check_slave(
    secret: str,
    proof: bytes,
    broker_set: str,
    master_id: int,
    slave_id: int,
    master_epoch: int,
    slave_nonce: bytes,
    master_nonce: bytes,
) -> bool:
    return verify(
        secret,
        proof,
        SLAVE_PURPOSE,
        *_fields(broker_set, master_id, slave_id, master_epoch, slave_nonce, master_nonce),
    )
