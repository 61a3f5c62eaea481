"""RocketMQ 5's gRPC API (apache/rocketmq-apis, `apache.rocketmq.v2`): the vendored .proto files
under apache/rocketmq/v2/ (Apache License 2.0, their headers kept) and the modules `make proto`
generates from them. broker/rocketmq.py serves `MessagingService` with them.

These descriptors register the `apache.rocketmq.v2` names in protobuf's default pool, as the
official clients' own generated modules do: one process imports one or the other, not both.
"""
