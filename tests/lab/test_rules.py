"""The lab's pure parts: the address plan and the fault rules (no namespaces here)."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.errors import ConfigError
from tidelog.lab import rules
from tidelog.lab.plan import CLIENT_SITE, LabPlan, make_plan

PROCS = [
    ("controller-c1", "dc-a"),
    ("controller-c2", "dc-b"),
    ("controller-c3", "dc-c"),
    ("broker-a-0", "dc-a"),
    ("broker-a-1", "dc-b"),
]


def plan() -> LabPlan:
    return make_plan("/data/lab", PROCS, wan_delay_ms=2)


def test_every_process_gets_its_own_address_in_its_datacenter_block() -> None:
    p = plan()
    addrs = [h.address for h in p.hosts]
    assert len(set(addrs)) == len(addrs)
    assert p.sites == ("dc-a", "dc-b", "dc-c", CLIENT_SITE)
    for h in p.hosts:
        assert p.site_of(h.address) == h.site
        assert ipaddress.ip_address(h.router) in ipaddress.ip_network(f"{h.address}/24", strict=False)
        assert len(h.veth_host) <= 15 and len(h.veth_router) <= 15  # the kernel's limit for link names
    assert p.host("broker-a-0").address.startswith("10.100.")
    assert p.host("broker-a-1").address.startswith("10.101.")
    assert LabPlan.from_json(p.to_json()) == p


def test_two_data_dirs_never_share_names() -> None:
    assert make_plan("/x/one", PROCS).prefix != make_plan("/x/two", PROCS).prefix


@pytest.mark.parametrize(
    "procs, message",
    [
        ([], "at least one"),
        ([("broker-a-0", "")], "has no datacenter"),
        ([("broker-a-0", "client")], "client side"),
    ],
)
def test_bad_plans_are_refused(procs: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_plan("/d", procs)


def _drops(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().endswith("drop")]


def test_a_partition_drops_both_ways_and_one_way_drops_one() -> None:
    p = plan()
    both = rules.step(p, rules.empty(), rules.Cut("dc-a", "dc-b"))
    pre = _drops(rules.render(both).split("chain out")[0])
    a = "{ " + ", ".join(sorted([p.host("controller-c1").address, p.host("broker-a-0").address])) + " }"
    b = "{ " + ", ".join(sorted([p.host("controller-c2").address, p.host("broker-a-1").address])) + " }"
    assert pre == [f"ip saddr {a} ip daddr {b} drop", f"ip saddr {b} ip daddr {a} drop"]
    one = rules.step(p, rules.empty(), rules.Cut("dc-a", "dc-b", oneway=True))
    assert _drops(rules.render(one).split("chain out")[0]) == [f"ip saddr {a} ip daddr {b} drop"]


def test_isolating_a_process_from_the_controllers_names_only_those_addresses() -> None:
    p = plan()
    state = rules.step(p, rules.empty(), rules.Isolate("broker-a-0", "controllers"))
    cut = state["cuts"][0]
    assert cut["src"] == [p.host("broker-a-0").address]
    assert sorted(cut["dst"]) == sorted(p.host(f"controller-c{i}").address for i in (1, 2, 3))


def test_isolating_a_datacenter_cuts_it_from_every_other_process_and_the_client() -> None:
    p = plan()
    cut = rules.step(p, rules.empty(), rules.Isolate("dc-b"))["cuts"][0]
    assert set(cut["src"]) | set(cut["dst"]) == {h.address for h in p.hosts}
    assert p.host("client").address in cut["dst"]


def test_loss_renders_numgen_both_ways_and_delay_goes_to_the_relay_only() -> None:
    p = plan()
    s = rules.step(p, rules.empty(), rules.Loss("dc-a", "dc-b", 30))
    s = rules.step(p, s, rules.Delay("dc-a", "dc-b", 20))
    text = rules.render(s)
    assert text.count("numgen random mod 100 < 30 drop") == 4  # prerouting and postrouting, each way
    assert "20" not in "".join(_drops(text))
    delays = rules.relay_delays(p, s)
    assert delays["dc-a>dc-b"] == 20 and delays["dc-b>dc-a"] == 20 and delays["dc-a>dc-c"] == 2


def test_postrouting_matches_only_the_relays_own_packets() -> None:
    """Forwarded packets cross pre- and postrouting: matching them twice would double a loss."""
    s = rules.step(plan(), rules.empty(), rules.Loss("dc-a", "dc-b", 10))
    post = rules.render(s).split("chain post")[1]
    assert all(line.startswith(f"meta mark {rules.LOCAL_MARK:#x} ") for line in _drops(post))


@pytest.mark.parametrize(
    "event, message",
    [
        (rules.Cut("dc-a", "nowhere"), "no datacenter, process or group"),
        (rules.Cut("dc-a", "broker-a-0"), "share a process"),
        (rules.Isolate("broker-a-0", "dc-a"), "share a process|is part of"),
        (rules.Loss("dc-a", "dc-b", 0), "1..100"),
        (rules.Loss("dc-a", "dc-b", 101), "1..100"),
        (rules.Delay("dc-a", "client", 5), "between two datacenters"),
        (rules.Delay("dc-a", "dc-a", 5), "between two datacenters"),
        (rules.Delay("dc-a", "dc-b", -1), "0..10000"),
    ],
)
def test_bad_faults_are_refused_and_change_nothing(event: rules.Event, message: str) -> None:
    p = plan()
    before = rules.step(p, rules.empty(), rules.Cut("dc-a", "dc-c"))
    snapshot = repr(before)
    with pytest.raises(ConfigError, match=message):
        rules.step(p, before, event)
    assert repr(before) == snapshot


GROUPS = ["dc-a", "dc-b", "dc-c", "client", "controllers", "broker-a-0", "broker-a-1", "controller-c3"]
events = st.one_of(
    st.builds(rules.Cut, st.sampled_from(GROUPS), st.sampled_from(GROUPS), st.booleans()),
    st.builds(rules.Loss, st.sampled_from(GROUPS), st.sampled_from(GROUPS), st.integers(1, 100)),
    st.builds(rules.Isolate, st.sampled_from(GROUPS), st.sampled_from([None, *GROUPS])),
    st.just(rules.Heal()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=12))
def test_the_ruleset_always_holds_exactly_the_faults_in_force(seq: list[rules.Event]) -> None:
    p = plan()
    state = rules.empty()
    for ev in seq:
        try:
            state = rules.step(p, state, ev)
        except ConfigError:
            continue
    text = rules.render(state)
    pre = _drops(text.split("chain out")[0])
    want = sum(1 if c["oneway"] else 2 for c in state["cuts"]) + 2 * len(state["losses"])
    assert len(pre) == want
    assert len(_drops(text.split("chain post")[1])) == want
    # every address in a rule is a process of the lab: a fault never reaches beyond it
    lab = {h.address for h in p.hosts}
    assert set(re.findall(r"10\.\d+\.\d+\.\d+", text)) <= lab
    if seq and isinstance(seq[-1], rules.Heal):
        assert pre == []
