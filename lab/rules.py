"""Network faults as data, and the nftables ruleset that enforces them (pure).

The fault state is a small document kept beside the cluster (`lab/faults.json` in its data
dir): cuts between two groups of processes (both ways or one way), random loss between two
groups, and the extra delay between two datacenters. `step(state, event)` applies one verb and
returns the new state; `render(plan, state)` gives the whole `inet tidefault` table of the
router namespace, which replaces the old one in one `nft -f` transaction, so a fault is never
half applied. Delay is not a packet rule (no `netem` here): `relay_delays` gives the relay its
per-direction delays.

Where the rules match: every packet between two processes crosses the router. A packet that is
forwarded (client ↔ datacenter, or within a datacenter) is matched in `prerouting` with its real
addresses. Traffic between two datacenters is redirected to the relay: the sender's packets are
matched in `prerouting` before the redirect (real addresses), and the relay's answers to the
sender in `postrouting` after the address of the far end has been put back (local packets are
marked in `output` so forwarded packets are not matched twice, which would double a loss rate).
The relay's own leg to the far end carries the router's address and matches nothing, so cutting
the sender's leg cuts the conversation.

A group is a datacenter name, a process name, `controllers`, `brokers`, or `client`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tidelog.errors import ConfigError
from tidelog.lab.plan import CLIENT_SITE, LabPlan

TABLE = "tidefault"
LOCAL_MARK = 0x7D1
Faults = dict[str, Any]


def empty() -> Faults:
    return {"cuts": [], "losses": [], "delays": {}}


@dataclass(frozen=True)
class Cut:
    a: str
    b: str
    oneway: bool = False


@dataclass(frozen=True)
class Loss:
    a: str
    b: str
    percent: int


@dataclass(frozen=True)
class Delay:
    a: str
    b: str
    ms: float


@dataclass(frozen=True)
class Isolate:
    what: str
    frm: str | None = None  # None: from every other process


@dataclass(frozen=True)
class Heal:
    pass


Event = Cut | Loss | Delay | Isolate | Heal


def members(plan: LabPlan, group: str) -> list[str]:
    """The addresses of a group's processes; an unknown group is a clear error."""
    if group in plan.sites:
        return [h.address for h in plan.hosts if h.site == group]
    if group == "controllers":
        return [h.address for h in plan.hosts if h.name.startswith("controller-")]
    if group == "brokers":
        return [
            h.address for h in plan.hosts if h.site != CLIENT_SITE and not h.name.startswith("controller-")
        ]
    for h in plan.hosts:
        if h.name == group:
            return [h.address]
    raise ConfigError(
        f"no datacenter, process or group named {group!r} in this lab",
        hint=f"datacenters: {', '.join(plan.sites)}; processes: "
        f"{', '.join(h.name for h in plan.hosts)}; or controllers, brokers",
    )


def _pair(plan: LabPlan, a: str, b: str) -> tuple[list[str], list[str]]:
    left, right = members(plan, a), members(plan, b)
    both = set(left) & set(right)
    if both:
        raise ConfigError(f"{a} and {b} share a process: a fault needs two separate groups")
    return left, right


def _isolation(plan: LabPlan, what: str, frm: str | None) -> dict[str, Any]:
    mine = members(plan, what)
    if frm is None:
        others = [h.address for h in plan.hosts if h.address not in mine]
        label = "everything"
    else:
        others = members(plan, frm)
        label = frm
    if set(mine) & set(others):
        raise ConfigError(f"{what} is part of {label}: isolate it from another group")
    return {"what": f"{what} <-> {label}", "src": mine, "dst": others, "oneway": False}


def _check_delay(plan: LabPlan, a: str, b: str, ms: float) -> None:
    dcs = plan.dc_sites()
    if a not in dcs or b not in dcs or a == b:
        raise ConfigError(
            f"delay is set between two datacenters ({', '.join(dcs)}), not {a} and {b}",
            hint="the relay that adds it sits on the links between datacenters",
        )
    if not 0 <= ms <= 10_000:
        raise ConfigError(f"delay must be 0..10000 ms, not {ms}")


def step(plan: LabPlan, state: Faults, event: Event) -> Faults:
    """The fault state after one verb."""
    out = copy.deepcopy(state) if state else empty()
    match event:
        case Heal():
            return empty()
        case Cut(a, b, oneway):
            left, right = _pair(plan, a, b)
            out["cuts"].append(
                {"what": f"{a} {'->' if oneway else '<->'} {b}", "src": left, "dst": right, "oneway": oneway}
            )
        case Isolate(what, frm):
            out["cuts"].append(_isolation(plan, what, frm))
        case Loss(a, b, percent):
            if not 0 < percent <= 100:
                raise ConfigError(f"loss must be 1..100 percent, not {percent}")
            left, right = _pair(plan, a, b)
            out["losses"].append(
                {"what": f"{a} <-> {b} {percent}%", "src": left, "dst": right, "percent": percent}
            )
        case Delay(a, b, ms):
            _check_delay(plan, a, b, ms)
            out["delays"][f"{a}>{b}"] = ms
            out["delays"][f"{b}>{a}"] = ms
        case _:
            raise ConfigError(f"unknown fault {event!r}")
    return out


def _set(addrs: list[str]) -> str:
    return "{ " + ", ".join(sorted(addrs)) + " }"


def _matches(state: Faults) -> list[str]:
    lines = []
    for cut in state.get("cuts", []):
        lines.append(f"ip saddr {_set(cut['src'])} ip daddr {_set(cut['dst'])} drop")
        if not cut["oneway"]:
            lines.append(f"ip saddr {_set(cut['dst'])} ip daddr {_set(cut['src'])} drop")
    for loss in state.get("losses", []):
        p = int(loss["percent"])
        lines.append(
            f"ip saddr {_set(loss['src'])} ip daddr {_set(loss['dst'])} numgen random mod 100 < {p} drop"
        )
        lines.append(
            f"ip saddr {_set(loss['dst'])} ip daddr {_set(loss['src'])} numgen random mod 100 < {p} drop"
        )
    return lines


def render(state: Faults) -> str:
    """The `nft -f` input that replaces the fault table with exactly `state`."""
    rules = _matches(state)
    pre = "".join(f"    {r}\n" for r in rules)
    post = "".join(f"    meta mark {LOCAL_MARK:#x} {r}\n" for r in rules)
    return (
        f"table inet {TABLE}\ndelete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        f"  chain pre {{\n    type filter hook prerouting priority -150; policy accept;\n{pre}  }}\n"
        f"  chain out {{\n    type filter hook output priority 0; policy accept;\n"
        f"    meta mark set {LOCAL_MARK:#x}\n  }}\n"
        f"  chain post {{\n    type filter hook postrouting priority 110; policy accept;\n{post}  }}\n"
        f"}}\n"
    )


def render_nat(plan: LabPlan, relay_port: int) -> str:
    """Traffic between two datacenters goes through the relay; the client's does not."""
    lines = []
    dcs = plan.dc_sites()
    for a in dcs:
        for b in dcs:
            if a != b:
                lines.append(
                    f"    ip saddr 10.{plan.site_octets[a]}.0.0/16 ip daddr 10.{plan.site_octets[b]}.0.0/16 "
                    f"meta l4proto tcp redirect to :{relay_port}\n"
                )
    return (
        "table ip tidenat {\n  chain pre {\n    type nat hook prerouting priority dstnat; policy accept;\n"
        + "".join(lines)
        + "  }\n}\n"
    )


def relay_delays(plan: LabPlan, state: Faults) -> dict[str, float]:
    """Delay in ms for each direction `a>b` between datacenters: the lab's WAN delay unless a fault
    set another."""
    dcs = plan.dc_sites()
    out = {f"{a}>{b}": plan.wan_delay_ms for a in dcs for b in dcs if a != b}
    out.update({k: float(v) for k, v in state.get("delays", {}).items()})
    return out


def describe(state: Faults) -> list[str]:
    return (
        [c["what"] + (" cut" if not c["oneway"] else " cut one way") for c in state.get("cuts", [])]
        + [f"{x['what']} loss" for x in state.get("losses", [])]
        + [f"{k} {v:g}ms delay" for k, v in sorted(state.get("delays", {}).items())]
    )
