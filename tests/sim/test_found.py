"""The bugs the simulator found, each as a fixed seed (and its shrunk schedule).

A test here is `xfail(strict=True)` while the bug lives in code outside the simulator: it turns
into a failure (XPASS) the day the fix lands, and then the mark comes off.
"""

from __future__ import annotations

from tidelog.sim.faults import Fault
from tidelog.sim.world import DEFAULT_FAULTS, World, run_seed


def test_seed_1_a_master_restarted_in_its_epoch_diverges_from_a_slave() -> None:
    """Fixed: b1, master of epoch 1, crashes between sending a write and flushing it and is back
    before the controller notices. It used to lead epoch 1 again, writing other records at those
    offsets where the slave kept the lost ones (the epochs agreed, so fork repair kept them). Now
    it asks for a new epoch (controller/RULES.md E8, broker/server.py::_crashed_master_of)."""
    out = run_seed(1, faults=[Fault(7476, "crash", "b1", 300)])
    assert out.ok, out.violation


def test_seed_46_a_stale_controller_leader_extends_a_deposed_masters_lease() -> None:
    """Fixed: a controller leader cut off from its majority led on for leader_fallback_timeout_ms
    (3 s) and answered heartbeats, renewing the cut-off master's lease past the new leader's
    election of another master. A leader now withholds the lease unless a majority answered it
    within a fraction of the heartbeat timeout (ha/lease.py::grants_lease)."""
    shrunk = [Fault(20440, "partition", "dc1", 5231)]
    for out in (run_seed(46), run_seed(46, faults=shrunk)):
        assert out.ok, out.violation


def test_seed_1_a_master_alone_confirms_what_a_crash_takes_back() -> None:
    """Fixed: a master alone in its SyncStateSet confirmed a record as soon as it was appended,
    before its fsync (MasterCore counted its log's end): a reader could see it, a crash took it
    back. Under flush: sync it now counts only what it has flushed (MasterCore.durable)."""
    out = run_seed(1, faults=[Fault(5000, "crash", "b2", 30000), Fault(15192, "crash", "b1", 8000)])
    assert out.ok, out.violation


def test_seed_2645_a_paused_controller_leader_elects_while_the_old_master_still_acknowledges() -> None:
    """Fixed: with in_sync_replicas 2 of three (a write covered by the lease alone), the controller
    leader, paused for 4.4 s while another controller is down, resumed, decided at once on its stale
    table that the master was dead, and then answered the master's heartbeats that had queued
    during the pause, renewing its lease before the election committed: the old master
    acknowledged a write the new one lacked. A leader now fences the master's lease from before it
    decides an election until Raft settles it (controller/RULES.md L7, ha/lease.py::LeaseFences)."""
    shrunk = [Fault(2106, "pause", "c0", 4360), Fault(2506, "crash", "c1", 5415)]
    for out in (run_seed(2645), run_seed(2645, faults=shrunk)):
        assert out.ok, out.violation


def test_seed_2645_a_paused_controller_leader_keeps_the_master_it_did_not_see_die() -> None:
    """Fixed: the same leader, resuming from its 4.4 s pause, saw the master silent past its
    timeout and a slave heard since before the pause, took that for witnessed silence and elected
    b1 11 ms later: safe under L7, but a needless failover. A leader whose loop did not turn for
    half a timeout now opens its grace again and no member witnesses the gap (controller/RULES.md
    L9, HeartbeatTable.on_tick), so b2 stays master of epoch 1."""
    shrunk = [Fault(2106, "pause", "c0", 4360), Fault(2506, "crash", "c1", 5415)]
    out = run_seed(2645, faults=shrunk, trace=True)
    assert out.ok, out.violation
    elections = [line for line in out.trace if "is master of bs" in line]
    assert len(elections) == 1 and "broker 2 is master of bs at epoch 1" in elections[0], elections
    assert any("c0 was not listening" in line for line in out.trace)


def test_seed_2144_a_new_leader_counts_its_own_deafness_as_the_masters_silence() -> None:
    """Fixed: c2 (dc3) is partitioned for 2.3 s and hears nobody; 0.3 s after that heals, dc1 (the
    master b3, the Raft leader c0) is cut off. c2 became leader and, within its grace, elected b2
    1.3 s later: b3 had not been heard for 5 s and b2 counted as a witness, because its gap (the
    2.3 s c2 was cut off) is shorter than the timeout and so did not restart its run. But b3 was
    silent only 2 s; the lease c0 granted it before losing its majority still ran, and b3
    acknowledged a write b2 lacked. A new leader now fails a master over on witnessed silence only
    once no earlier leader's lease can run (controller/RULES.md L4, ha/lease.py::prior_leader_lease_ms)."""
    shrunk = [
        Fault(3204, "crash", "b2", 6120),
        Fault(5187, "replay", "", 3028, 8000.0),
        Fault(53_799, "partition", "dc3", 2344),
        Fault(56_452, "partition", "dc1", 6246),
    ]
    out = run_seed(2144, faults=shrunk)
    assert out.ok, out.violation


def test_seed_6343_a_broker_back_from_a_fail_stop_takes_a_stale_leaders_old_role() -> None:
    """Fixed: b2, master of epoch 2, fail-stopped on a disk fault; the controllers elected b1
    (epoch 3) while c1, cut from its peers, still answered as leader from its old state. b2's
    store opened again: it had not heard of epoch 3, took c1's answer and led epoch 2 again
    without records b1 confirmed; the new leader's answers, naming b1 master, renewed its lease.
    Now a reply that renews no lease (`lease_withheld`) makes nobody master (ha/roles.py,
    Kind.SELF_UNVOUCHED), and a lease is renewed only by an answer naming the broker master, for
    that epoch alone (ha/lease.py::Lease). The schedule as drawn before lease_lapse existed."""
    out = run_seed(6343, faults=_drawn_before_lease_lapse(6343))
    assert out.ok, out.violation


def _drawn_before_lease_lapse(seed: int) -> list[Fault]:
    """The seed's schedule without the lease_lapse drawn apart since (sim/faults.py LAPSE_P): the
    other faults are drawn as they were, so the seed replays the interleaving it was found by."""
    return [f for f in World(seed, None, DEFAULT_FAULTS, False).faults if f.kind != "lease_lapse"]


def test_seed_7426_a_write_sized_for_the_master_alone_is_acknowledged_after_a_member_joins() -> None:
    """Fixed: b2, master alone in its set, sized a write for its own ack; before its fsync ended it
    proposed b1 (caught up to the confirm offset) into the set, and then acknowledged the write
    alone (one ack needs no counting, the shell thought). The controller applied the expansion;
    b1 lacked the write and could have been elected. While an expansion is pending, every release
    needs the joining member (ha/mastercore.py::MasterCore.acked_by, HaMaster.wait_acks)."""
    shrunk = [
        Fault(1574, "partition", "dc2", 4009),
        Fault(4955, "delay", "", 240, 200.0),
        Fault(7576, "delay", "", 7039, 3000.0),
        Fault(10_062, "crash", "b2", 2315),
        Fault(16_121, "crash", "b1", 1784),
        Fault(25_282, "replay", "", 4290, 1000.0),
        Fault(26_709, "partition", "dc3", 3574),
        Fault(40_515, "pause", "b2", 3259),
        Fault(42_392, "replay", "", 5084, 1000.0),
        Fault(42_625, "partition", "dc1", 6008),
        Fault(42_793, "leader", "", 0),
        Fault(44_028, "delay", "", 8078, 200.0),
    ]
    for out in (run_seed(7426), run_seed(7426, faults=shrunk)):
        assert out.ok, out.violation


def test_seed_5374_a_write_sized_for_the_whole_set_is_released_on_a_newcomers_ack() -> None:
    """Fixed: all-ack, three brokers. b1, master with the set shrunk to [1, 2] (b3 crashed), sized
    a write for both members; b3 came back and joined ([1, 2, 3]) before the write was released,
    and then the acks of b1 and b3 (two, as sized) released it while b2, paused and lacking it,
    stayed a member; b2 was elected. A write that needs the whole set now needs whoever is in it
    when it is released (ha/ackpolicy.py::release_need, EVERY_MEMBER)."""
    out = run_seed(5374)
    assert out.ok, out.violation


def test_seed_21602_a_record_damaged_on_its_only_copy_stops_writes_without_breaking_a_promise() -> None:
    """Not a bug: a bit flipped in the master's only copy of a record no slave had yet (both slaves
    were cut off). No replica can copy past it, so writes that need a slave wait for an operator
    (docs/ARCHITECTURE.md §3.9); the liveness check no longer demands writes then
    (sim/world.py::World.unrepairable)."""
    shrunk = [
        Fault(1585, "replay", "", 1646, 1000.0),
        Fault(3418, "replay", "", 2886, 1000.0),
        Fault(4887, "leader", "", 0),
        Fault(5503, "dup", "", 6720, 0.224),
        Fault(7812, "partition", "dc3", 5060),
        Fault(8518, "partition", "dc2", 4883),
        Fault(9786, "bitflip", "b2", 0),
    ]
    out = run_seed(21602, faults=shrunk)
    assert out.ok, out.violation


def test_seed_18180_a_late_copy_of_an_unanswered_attempt_adds_a_member_after_a_refusal() -> None:
    """Fixed: b2 proposed adding b1; the first attempt went unanswered (the leader changed), the
    next was refused (b1 not alive) and b2 dropped the proposal, releasing writes without b1. A
    copy of the earlier attempt, run late, found b1 alive and added it (same set epoch: A5 could
    not stop it) while b1 lacked a confirmed record. Attempts are numbered, and an answer fences
    every earlier attempt of that master (controller/RULES.md A4b)."""
    shrunk = [
        Fault(2543, "crash", "b1", 5090),
        Fault(7160, "ctrl_split", "c1", 3401),
        Fault(8041, "crash", "c2", 695),
        Fault(10_094, "bitflip", "b1", 0),
        Fault(12_685, "partition", "dc1", 7192),
        Fault(18_778, "replay", "", 2375, 8000.0),
    ]
    for out in (run_seed(18180), run_seed(18180, faults=shrunk)):
        assert out.ok, out.violation


def test_seed_3694_a_late_copy_of_a_restarted_masters_call_elects_another_master_beside_it() -> None:
    """Fixed: b2, back from a crash as master of epoch 2, asked for a new epoch and got epoch 3; a
    copy of that call, run late (a replay fault), found it master of epoch 3 and holding a lease,
    and elected b1 beside it as master of epoch 4 (RULES.md E8 checked only that the caller was the
    recorded master): b2 acknowledged a write b1 lacked. The call now names the epoch it gives up,
    and a copy naming an epoch the set has left is refused (controller/RULES.md E8)."""
    shrunk = [
        Fault(3793, "oneway", "b3", 4998, 3.0),
        Fault(5216, "delay", "", 7984, 3000.0),
        Fault(13_588, "failover_split", "", 5066, 3525.0),
        Fault(15_831, "delay", "", 6300, 200.0),
        Fault(19_199, "replay", "", 4345, 8000.0),
        Fault(19_635, "failover_split", "", 6792, 3906.0),
        Fault(23_127, "lease_lapse", "", 11_847, 3650.0),
    ]
    for out in (run_seed(3694), run_seed(3694, faults=shrunk)):
        assert out.ok, out.violation
