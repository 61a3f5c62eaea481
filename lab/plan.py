"""The network lab's plan: which namespace, interface and address each process gets (pure).

A `--netns` cluster gives every process its own network namespace, so that a fault can cut one
process (`tide fault isolate broker-a-0 --from controllers`) as well as a whole datacenter. The
processes of a datacenter share that datacenter's address block, `10.<100+k>.0.0/16` for the
k-th datacenter, so a datacenter is one prefix on the wire; the client side is one more site,
`client` (`10.99.0.0/16`). Each process namespace has one veth to a router namespace (`wan`),
point to point: process `i` of the lab is `10.<site>.<i>.2`, its router end `10.<site>.<i>.1`.
Every packet between two processes therefore crosses the router, where the faults are applied
(lab/rules.py) and where traffic between two datacenters is handed to the delay relay
(lab/relay.py). The kernel here has no `netem`, so latency comes from that relay.

Names: namespaces are `<prefix>-<process>`, `<prefix>-wan`; interfaces on the host side are
created as `<prefix>v<i>` / `<prefix>w<i>` before they move (15 characters at most); the prefix
is `tl` and six hex digits of the data directory's path, so two labs never share a name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import ConfigError

CLIENT_SITE = "client"
CLIENT_NAME = "client"
RELAY_PORT = 7999
# Every process has its own address, so every process can use the same ports.
CONTROLLER_RAFT_PORT = 7100
CONTROLLER_GRPC_PORT = 7101
BROKER_PORT = 7200
BROKER_HA_PORT = 7201
MAX_PROCESSES = 250


@dataclass(frozen=True)
class Host:
    """One process's place in the lab."""

    name: str  # process name (controller-c1, broker-a-0) or `client`
    site: str  # datacenter name, or `client`
    index: int  # 1.., unique in the lab
    address: str  # the process's own address
    router: str  # the router's end of its link (its default route)
    netns: str
    veth_host: str  # the process side, named so before it moves into `netns` (then `eth0`)
    veth_router: str  # the router side, in the `wan` namespace


@dataclass(frozen=True)
class LabPlan:
    prefix: str
    sites: tuple[str, ...]  # datacenters in order, then `client`
    hosts: tuple[Host, ...]
    wan_netns: str
    wan_delay_ms: float = 0.0
    site_octets: dict[str, int] = field(default_factory=dict)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ConfigError(
            f"no process named {name!r} in this lab", hint=f"one of: {', '.join(h.name for h in self.hosts)}"
        )

    def site_of(self, address: str) -> str | None:
        parts = address.split(".")
        if len(parts) != 4 or parts[0] != "10":
            return None
        for site, octet in self.site_octets.items():
            if str(octet) == parts[1]:
                return site
        return None

    def dc_sites(self) -> list[str]:
        return [s for s in self.sites if s != CLIENT_SITE]

    def to_json(self) -> dict[str, object]:
        return {
            "prefix": self.prefix,
            "sites": list(self.sites),
            "wan_netns": self.wan_netns,
            "wan_delay_ms": self.wan_delay_ms,
            "site_octets": dict(self.site_octets),
            "hosts": [h.__dict__ for h in self.hosts],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LabPlan:
        hosts = tuple(Host(**h) for h in doc["hosts"])
        return cls(
            prefix=str(doc["prefix"]),
            sites=tuple(doc["sites"]),
            hosts=hosts,
            wan_netns=str(doc["wan_netns"]),
            wan_delay_ms=float(doc.get("wan_delay_ms", 0.0)),
            site_octets=dict(doc["site_octets"]),
        )


def lab_prefix(data_dir: str) -> str:
    return "tl" + hashlib.sha1(data_dir.encode()).hexdigest()[:6]


def make_plan(data_dir: str, processes: Sequence[tuple[str, str]], *, wan_delay_ms: float = 0.0) -> LabPlan:
    """`processes`: (name, datacenter) in start order. A process without a datacenter is refused:
    in a lab every process lives somewhere."""
    if not processes:
        raise ConfigError("a lab needs at least one process")
    if len(processes) + 1 > MAX_PROCESSES:
        raise ConfigError(f"a lab holds at most {MAX_PROCESSES - 1} processes")
    if not 0 <= wan_delay_ms <= 10_000:
        raise ConfigError(f"the WAN delay must be 0..10000 ms, not {wan_delay_ms}", key="wan_delay_ms")
    sites: list[str] = []
    for name, dc in processes:
        if not dc:
            raise ConfigError(
                f"{name} has no datacenter: with --netns every process needs one",
                hint="list `datacenters` for each broker set and for the controller",
            )
        if dc == CLIENT_SITE:
            raise ConfigError(f"{name}: {CLIENT_SITE!r} is the lab's client side, not a datacenter name")
        if dc not in sites:
            sites.append(dc)
    if len(sites) > 100:
        raise ConfigError("a lab holds at most 100 datacenters")
    prefix = lab_prefix(data_dir)
    octets = {dc: 100 + k for k, dc in enumerate(sites)}
    octets[CLIENT_SITE] = 99
    hosts = []
    entries: Iterable[tuple[str, str]] = [*processes, (CLIENT_NAME, CLIENT_SITE)]
    for i, (name, site) in enumerate(entries, start=1):
        o = octets[site]
        hosts.append(
            Host(
                name=name,
                site=site,
                index=i,
                address=f"10.{o}.{i}.2",
                router=f"10.{o}.{i}.1",
                netns=f"{prefix}-{name}",
                veth_host=f"{prefix}v{i}",
                veth_router=f"{prefix}w{i}",
            )
        )
    return LabPlan(
        prefix=prefix,
        sites=(*sites, CLIENT_SITE),
        hosts=tuple(hosts),
        wan_netns=f"{prefix}-wan",
        wan_delay_ms=float(wan_delay_ms),
        site_octets=octets,
    )
