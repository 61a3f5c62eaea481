"""Drills on a local cluster: inject faults and check that nothing acknowledged was lost.

- `faults`: the fault verbs of `tide fault` (network faults through the lab's rules, process
  faults by pid);
- `scenarios`: the named and random drill schedules of `tide drill run|random` and their checker;
- `killmaster`: the kill -9 failover drill of `tide drill kill-master` and `make run`, and the
  read-back helpers the scenarios share;
- `quorum`: the lose-majority-dc drills of `tide drill run` (the controller majority's datacenter
  lost, the forced recovery of docs/RUNBOOK-quorum.md, the old majority fenced and added back).

They sit above both the network lab (`tidelog.lab`: addresses, rules, namespaces) and the local
cluster runner (`tidelog.localcluster`), which builds on the lab; neither imports them.
"""
