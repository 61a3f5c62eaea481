"""A controller node's Prometheus metrics: its Raft node and the replicated state, read at scrape time.

Raft: term, whether this node leads, whether it knows a leader, commit and applied indexes
(PySyncObj's `getStatus()`, read once per scrape, never per request). Replicated state, the same
on every node: broker sets, registered brokers, each set's master epoch and master elections,
SyncStateSet size and changes. Liveness exists on the leader only (heartbeats are not in Raft),
so alive brokers are exported by the leader alone. Request latency per gRPC method comes from
`tidelog.metrics.RpcTimer`. Every series carries `node_id`; the names are in deploy/METRICS.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tidelog.controller.raft import RaftStatus
from tidelog.metrics import MetricsServer, RpcMetrics, RpcTimer, new_registry, start_server

if TYPE_CHECKING:
    from tidelog.controller.node import ControllerNode

IDENTITY = ("node_id",)


def raft_metrics(node_id: str, status: RaftStatus) -> list[Metric]:
    """The Raft gauges of one node from its status."""
    out: list[Metric] = []
    for name, value, doc in (
        ("tidelog_raft_term", status.term, "The node's current Raft term"),
        ("tidelog_raft_is_leader", 1 if status.is_leader else 0, "1 while this node is the Raft leader"),
        ("tidelog_raft_has_leader", 1 if status.leader_raft else 0, "1 while this node knows a Raft leader"),
        ("tidelog_raft_commit_index", status.commit_index, "The node's Raft commit index"),
        ("tidelog_raft_last_applied", status.last_applied, "The last Raft entry the node applied"),
    ):
        g = GaugeMetricFamily(name, doc, labels=list(IDENTITY))
        g.add_metric([node_id], value)
        out.append(g)
    return out


def broker_set_metrics(node_id: str, sets: list[Any], alive: dict[str, int] | None) -> list[Metric]:
    """Gauges and counters of the replicated broker sets; `alive` (leader only) counts live brokers."""
    per_set = [*IDENTITY, "broker_set"]
    count = GaugeMetricFamily(
        "tidelog_controller_broker_sets", "Broker sets registered", labels=list(IDENTITY)
    )
    count.add_metric([node_id], len(sets))
    brokers = GaugeMetricFamily("tidelog_controller_brokers", "Brokers registered in the set", labels=per_set)
    epoch = GaugeMetricFamily("tidelog_controller_master_epoch", "The set's master epoch", labels=per_set)
    has_master = GaugeMetricFamily(
        "tidelog_controller_has_master", "1 while the set has a master", labels=per_set
    )
    elections = CounterMetricFamily(
        "tidelog_controller_master_elections",
        "Master elections of the set (each raises its master epoch, a failed one too)",
        labels=per_set,
    )
    sss = GaugeMetricFamily(
        "tidelog_controller_sync_state_set_size", "Members of the set's SyncStateSet", labels=per_set
    )
    sss_changes = CounterMetricFamily(
        "tidelog_controller_sync_state_set_changes",
        "Changes of the set's SyncStateSet, elections included (its set epoch)",
        labels=per_set,
    )
    live = GaugeMetricFamily(
        "tidelog_controller_alive_brokers", "Brokers heartbeating (leader only)", labels=per_set
    )
    for bs in sets:
        labels = [node_id, bs.name]
        brokers.add_metric(labels, len(bs.members))
        epoch.add_metric(labels, bs.master_epoch)
        has_master.add_metric(labels, 1 if bs.master_id is not None else 0)
        elections.add_metric(labels, bs.master_epoch)
        sss.add_metric(labels, len(bs.sync_state_set))
        sss_changes.add_metric(labels, bs.sss_epoch)
        if alive is not None:
            live.add_metric(labels, alive.get(bs.name, 0))
    out: list[Metric] = [count, brokers, epoch, has_master, elections, sss, sss_changes]
    if alive is not None:
        out.append(live)
    return out


class ControllerCollector(Collector):
    """One node's Raft status and replicated state, read on its event loop at scrape time."""

    def __init__(self, node: ControllerNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node_id = self.node.cfg.node_id
        yield from raft_metrics(node_id, self.node.raft.status())
        with self.node.raft.read() as state:
            sets = sorted(state.broker_sets.values(), key=lambda bs: bs.name)
        alive: dict[str, int] | None = None
        if self.node.raft.is_leader():
            alive = {bs.name: len(self.node.alive_ids(bs.name) or ()) for bs in sets}
        yield from broker_set_metrics(node_id, sets, alive)


class ControllerMetrics:
    """One controller node's registry, its collector, request timing and HTTP endpoint."""

    def __init__(self, node: ControllerNode) -> None:
        self.node = node
        self.registry = new_registry()
        self.rpc = RpcMetrics(self.registry, IDENTITY)
        self.registry.register(ControllerCollector(node))
        self._ident = (node.cfg.node_id,)
        self._server: MetricsServer | None = None

    def interceptor(self) -> RpcTimer:
        return RpcTimer(self.on_rpc)

    def on_rpc(self, method: str, request: Any, reply: Any, seconds: float, code: str) -> None:
        self.rpc.observe(self._ident, method, seconds, code)

    def ready(self) -> str | None:
        """Why this node is not ready, or None: its Raft group has a leader."""
        status = self.node.raft.status()
        if not status.leader_raft:
            return f"controller {status.node_id}: the Raft group has no leader (term {status.term})"
        return None

    async def start(self, address: str) -> None:
        self._server = await start_server(address, self.registry, self.ready)

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
