"""Local tidelog processes, one harness for `tide cluster up`, the tests and the benches.

- procs: free loopback ports, starting `python -m tidelog.cli ...` (`Proc`), waiting for a
  condition, stopping a process by its own pid (SIGTERM, then SIGKILL).
- configs: the controller and broker YAML configs, written readable by their owner only.
- groups: `ControllerCluster` and `BrokerSet`, processes of one controller cluster or broker set
  with their readiness waits, for tests and benches that drive them directly.
- topology, cluster: `tide cluster up|down|kill|restart` from a topology file, every process
  recorded in `cluster.json` (see deploy/local.yaml).
- certs: the throwaway CA and certificates of a topology with `tls:` (deploy/secure.yaml).
"""

from tidelog.localcluster.cluster import (
    STATE_FILE,
    bootstrap,
    client_env,
    client_options,
    client_tls,
    down,
    is_running,
    kill,
    process_count,
    read_state,
    restart,
    up,
    wait_masters,
)
from tidelog.localcluster.configs import broker_doc, controller_doc, write_config
from tidelog.localcluster.groups import BrokerSet, ControllerCluster, create_topic
from tidelog.localcluster.procs import (
    LOOPBACK,
    Proc,
    free_address,
    free_port,
    is_ours,
    proc_args,
    running,
    stop_process,
    wait_until,
)
from tidelog.localcluster.topology import Topology, load_topology

__all__ = [
    "LOOPBACK",
    "STATE_FILE",
    "BrokerSet",
    "ControllerCluster",
    "Proc",
    "Topology",
    "broker_doc",
    "bootstrap",
    "client_env",
    "client_options",
    "client_tls",
    "controller_doc",
    "create_topic",
    "down",
    "free_address",
    "free_port",
    "is_ours",
    "process_count",
    "is_running",
    "kill",
    "load_topology",
    "proc_args",
    "read_state",
    "restart",
    "running",
    "stop_process",
    "up",
    "wait_masters",
    "wait_until",
    "write_config",
]
