"""ha/rpobound.py, the RPO bound of a master alone in its SyncStateSet (controller/RULES.md L10).

The property that matters: whichever controller survives to be recovered, the reports its log
holds reach at least as far as every grant the master was given, less the bound; so nothing the
master acknowledged lies past what that survivor counts (client/unclean.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.ha.rpobound import AckBound, grant, held_by_every_node

BOUND = 1000

# a run: ("write", bytes) appends a report of the master's new end to the leader's log;
# ("replicate", node, entries) lets a follower take that many more of the leader's entries;
# ("beat",) is a heartbeat answered with a grant
_events = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 3000)),
        st.tuples(st.just("replicate"), st.sampled_from([1, 2]), st.integers(1, 4)),
        st.tuples(st.just("beat")),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(_events)
def test_no_grant_reaches_past_what_any_surviving_controller_counts(events: list[tuple]) -> None:
    log: list[int] = []  # the leader's (node 0's) log: each entry a reported offset, index = position + 1
    match = {0: 0, 1: 0, 2: 0}  # how many entries each node's log holds
    end = 0
    held = -1
    grants: list[int] = []
    for ev in events:
        if ev[0] == "write":
            end += ev[1]
            log.append(end)
            match[0] = len(log)
        elif ev[0] == "replicate":
            match[ev[1]] = min(len(log), match[ev[1]] + ev[2])
        else:
            # the leader commits what a majority holds and its state applies it
            commit = sorted(match.values())[1]
            recorded = log[commit - 1] if commit else -1
            held = held_by_every_node(recorded, commit, min(match.values()), held)
            grants.append(grant(held, BOUND))
    for node, holds in match.items():
        known = max(log[:holds], default=-1)  # what that node, recovered alone, counts from
        counted_until = max(known, 0) + BOUND
        assert all(g <= counted_until for g in grants), (node, known, grants)


@given(st.integers(-1, 10**9), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(-1, 10**9))
def test_what_every_node_holds_only_grows_and_only_once_they_all_hold_it(
    recorded: int, at: int, every: int, previous: int
) -> None:
    held = held_by_every_node(recorded, at, every, previous)
    assert held >= previous
    assert held == (max(previous, recorded) if every >= at else previous)


def test_a_master_alone_acknowledges_up_to_its_grant_of_its_own_epoch() -> None:
    bound = AckBound()
    assert bound.allows(3, 10**12, alone=True)  # no controller ever said it bounds
    bound.enforced = True
    assert not bound.allows(3, 1, alone=True)  # bounded, and nothing granted yet
    assert bound.allows(3, 10**12, alone=False)  # a member of the set holds every acknowledged write
    assert bound.granted(3, 5000)
    assert bound.allows(3, 5000, alone=True) and not bound.allows(3, 5001, alone=True)
    assert not bound.granted(3, 4000) and bound.limit == 5000  # a lower grant is no news
    assert not bound.allows(4, 100, alone=True)  # another epoch's grant is not this one's
    assert bound.granted(4, 100) and bound.limit == 100


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 10**6)), max_size=30))
def test_grants_within_an_epoch_never_shrink(grants: list[tuple[int, int]]) -> None:
    bound = AckBound()
    best: dict[int, int] = {}
    for epoch, limit in grants:
        before_epoch = bound.epoch
        bound.granted(epoch, limit)
        best[epoch] = max(best.get(epoch, -1), limit) if before_epoch == epoch else limit
        assert bound.epoch == epoch and bound.limit == best[epoch]
