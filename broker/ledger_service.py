"""The ledger gRPC service of a broker: validates each request, turns it into `broker.ledgers` calls,
and answers typed errors (the `tidelog.wire` convention). The wire types stop here."""

from __future__ import annotations

import grpc

from tidelog.broker.ledgers import AddRequest, Entry, LedgerReplica
from tidelog.proto import ledger_pb2 as pb
from tidelog.proto import ledger_pb2_grpc as pb_grpc
from tidelog.wire import check_request, rpc

MAX_WAIT_MS = 60_000


class LedgerService(pb_grpc.LedgerServicer):
    def __init__(self, ledgers: LedgerReplica) -> None:
        self.ledgers = ledgers

    @rpc
    async def Create(self, request: pb.CreateRequest, context: grpc.aio.ServicerContext) -> pb.CreateReply:
        check_request(bool(request.metadata), "metadata must not be empty")
        await self.ledgers.create(request.metadata, request.ledger_id)
        return pb.CreateReply(broker_id=self.ledgers.broker_id)

    @rpc
    async def Add(self, request: pb.AddRequest, context: grpc.aio.ServicerContext) -> pb.AddReply:
        add = AddRequest(
            request.ledger_id,
            request.entry_id,
            request.lac,
            request.length,
            bytes(request.digest),
            bytes(request.data),
            bytes(request.password),
            request.recovery,
        )
        replicas = await self.ledgers.add(add)
        return pb.AddReply(entry_id=request.entry_id, replicas=replicas, broker_id=self.ledgers.broker_id)

    @rpc
    async def AddBatch(
        self, request: pb.AddBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddBatchReply:
        entries = [Entry(e.entry_id, e.lac, e.length, e.digest, e.data) for e in request.entries]
        replicas = await self.ledgers.add_batch(request.ledger_id, request.password, entries)
        return pb.AddBatchReply(
            first_entry_id=entries[0].entry_id,
            last_entry_id=entries[-1].entry_id,
            replicas=replicas,
            broker_id=self.ledgers.broker_id,
        )

    @rpc
    async def Close(self, request: pb.CloseRequest, context: grpc.aio.ServicerContext) -> pb.CloseReply:
        last, length = await self.ledgers.close(request.ledger_id, request.password)
        return pb.CloseReply(last_entry_id=last, length=length, broker_id=self.ledgers.broker_id)

    @rpc
    async def Fence(self, request: pb.FenceRequest, context: grpc.aio.ServicerContext) -> pb.FenceReply:
        lac, length = await self.ledgers.fence(request.ledger_id, request.password)
        return pb.FenceReply(lac=lac, length=length, broker_id=self.ledgers.broker_id)

    @rpc
    async def Read(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.ReadReply:
        entries, lac = await self.ledgers.read(
            request.ledger_id, request.password, request.first, request.last, request.fence, request.max_bytes
        )
        return pb.ReadReply(
            entries=[
                pb.Entry(entry_id=e.entry_id, lac=e.lac, length=e.length, digest=e.digest, data=e.data)
                for e in entries
            ],
            lac=lac,
            broker_id=self.ledgers.broker_id,
        )

    @rpc
    async def Lac(self, request: pb.LacRequest, context: grpc.aio.ServicerContext) -> pb.LacReply:
        check_request(request.wait_ms <= MAX_WAIT_MS, f"wait_ms is at most {MAX_WAIT_MS}")
        check_request(request.previous >= -1, "previous is -1 or an entry id")
        lac, length, fenced = await self.ledgers.lac(
            request.ledger_id, request.password, request.previous, request.wait_ms
        )
        return pb.LacReply(
            lac=lac,
            length=length,
            fenced=fenced,
            broker_id=self.ledgers.broker_id,
            is_master=self.ledgers.replica.ha_master is not None,
        )
