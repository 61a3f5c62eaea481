"""A shared subscription's received messages: `SharedMessage` and the decoding of a SharedReceive
reply, checked against its CRC.

Below the clients (docs/ARCHITECTURE.md §2.2): the shared consumer (client/sharedconsumer.py) and
the broker's RocketMQ endpoint (broker/rocketmq.py) both decode receives with it."""

from __future__ import annotations

from typing import Any

from tidelog.client.transport import ConsumedMessage
from tidelog.commitlog.batch import RecordView, walk
from tidelog.commitlog.crc import crc32c
from tidelog.errors import CorruptRecordError


class SharedMessage(RecordView):
    """A received message: the fields of ConsumedMessage, its receipt and its delivery count."""

    __slots__ = ("receipt", "delivery_count")

    def __init__(self, buf: bytes, pos: int, broker_set: str, receipt: str, delivery_count: int) -> None:
        super().__init__(buf, pos, broker_set)
        self.receipt = receipt
        self.delivery_count = delivery_count


def decode_receive_reply(reply: Any, broker_set: str, address: str) -> list[ConsumedMessage]:
    """The messages of a SharedReceive reply (each a SharedMessage), checked against its CRC."""
    data: bytes = reply.records
    if crc32c(data) != reply.crc:
        raise CorruptRecordError(
            f"receive reply from {address}", 0, "the reply's CRC32C does not match its bytes"
        )
    starts = walk(data, f"receive reply from {address}", 0, verify_crc=False)
    if not len(starts) == reply.count == len(reply.receipts) == len(reply.attempts):
        raise CorruptRecordError(f"receive reply from {address}", -1, "records, receipts and counts disagree")
    return [
        SharedMessage(data, pos, broker_set, receipt, attempts)
        for pos, receipt, attempts in zip(starts, reply.receipts, reply.attempts, strict=True)
    ]
