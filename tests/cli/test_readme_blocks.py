"""The README's examples, run as shown (a section shown is a section tested): the step-by-step
"A cluster of your own" block as one bash script from a directory outside the clone, the
"From Python" and ledger blocks against a cluster, the secure topology's block, the operator's
blocks (retention, operating, watching, metrics) on a cluster of their own, and the retention
keys as a broker config. Only what cannot be known in advance is replaced, each substitution
named here. Not run here: the RocketMQ clients' blocks (tests/client/test_rocketmq_readme.py),
the Spark ones (tests/spark), and the network lab's (tests/lab/test_readme_lab.py, with the
lab's tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.conftest import REPO, LocalCluster, stop_cluster, tide, tide_env

pytestmark = pytest.mark.slow

README = (REPO / "README.md").read_text()
BIN = Path(sys.executable).parent


def block(lang: str, after: str) -> str:
    """The first ```lang block after the line holding `after`."""
    start = README.index(after)
    match = re.compile(rf"^```{lang}\n(.*?)^```", re.S | re.M).search(README, start)
    assert match, f"no {lang} block after {after!r}"
    return match.group(1)


def shown(script: str, substitutions: dict[str, str]) -> str:
    """`script` with each placeholder replaced, failing if the README no longer shows one."""
    for placeholder, run in substitutions.items():
        assert placeholder in script, f"the README no longer shows {placeholder!r}: update the test"
        script = script.replace(placeholder, run)
    return script


def run_script(
    script: str, cwd: Path, timeout: float = 300, data_dir: str = "tide-data"
) -> subprocess.CompletedProcess[str]:
    """`script` in bash (stopping at the first failure) from `cwd`, with the installed `tide` on
    PATH; the cluster it left in `cwd/data_dir`, if any, is stopped afterwards. Asserts it passed."""
    env = tide_env({"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    try:
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    finally:
        if (cwd / data_dir / "cluster.json").exists():
            stop_cluster(LocalCluster(cwd / data_dir, "", {}))
    assert out.returncode == 0, f"stdout:\n{out.stdout[-4000:]}\nstderr:\n{out.stderr[-4000:]}"
    return out


#: The step-by-step block's placeholders: the controller address `up` printed, and a drill sized for
#: a person watching it (30 s) shortened for the suite.
STEP_BY_STEP = {
    "export TIDE_CONTROLLERS=127.0.0.1:NNNN": 'export TIDE_CONTROLLERS="$(jq -r .controllers tide-data/cluster.json)"',
    "--duration 30s": "--duration 6s",
}


def test_the_step_by_step_section_runs_as_shown(tmp_path: Path) -> None:
    # from tmp_path, not the clone: deploy/local.yaml comes with the installed package
    out = run_script(shown(block("sh", "A cluster of your own, step by step"), STEP_BY_STEP), tmp_path, 400)
    consumed = [line for line in out.stdout.splitlines() if re.match(r"broker-a/\d@\d+ ", line)]
    assert len(consumed) == 10_000, "tide consume printed one line per message"
    assert "customer-1" in out.stdout
    assert re.search(r"│ acked_lost +│ 0 +│", out.stdout), "the drill lost nothing acknowledged"


def test_the_python_blocks_run_as_shown(cluster: LocalCluster, tmp_path: Path) -> None:
    for after, expect in (("From Python:", "hello"), ("BookKeeper's ledger API on the same log", "first")):
        code = block("python", after).replace('"127.0.0.1:9701"', repr(cluster.controllers))
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            env=tide_env(),
        )
        assert out.returncode == 0, f"{after}: {out.stderr[-3000:]}"
        assert expect in out.stdout, out.stdout


def test_row18_where_tide_consume_is_shown_it_says_when_it_stops() -> None:
    (line,) = [
        ln for ln in block("sh", "A cluster of your own").splitlines() if ln.startswith("tide consume")
    ]
    assert "stops after 5 s without a message (--idle-timeout 0: never)" in line
    shown = tide("consume", "--help").stdout
    assert re.search(r"--idle-timeout[^[]*\[default: 5\.0;", shown), "the README's 5 s is the default"
    assert "stops after --idle-timeout seconds without a message" in " ".join(shown.split())


#: The secure block's placeholders: what `up` printed (from cluster.json), alice's keys from `tide
#: user create --json`, and a broker's pid for the certificate reload.
_ALICE = '--access-key "$(jq -r .access_key <<<"$ALICE")" --secret-key "$(jq -r .secret_key <<<"$ALICE")"'
SECURE = {
    "export TIDE_CONTROLLERS=127.0.0.1:NNNN": 'export TIDE_CONTROLLERS="$(jq -r .controllers tide-data/cluster.json)"',
    "export TIDE_ACCESS_KEY=TK... TIDE_SECRET_KEY=...": (
        'export TIDE_ACCESS_KEY="$(jq -r .credentials.access_key tide-data/cluster.json)"'
        ' TIDE_SECRET_KEY="$(jq -r .credentials.secret_key tide-data/cluster.json)"'
    ),
    "tide user create alice": 'ALICE="$(tide user create alice --json)"',
    "--access-key AK --secret-key SK": _ALICE,
    "kill -HUP <pid>": (
        'kill -HUP "$(jq -r \'[.processes[] | select(.kind == "broker")][0].pid\' tide-data/cluster.json)"'
    ),
}


def test_the_secure_section_runs_as_shown(tmp_path: Path) -> None:
    """Grants take effect by the time `tide acl grant` returns (the controller waits for the
    brokers to enforce them), so the block runs as written, alice's produce right after her grant."""
    out = run_script(shown(block("sh", "TLS and users: the secure topology"), SECURE), tmp_path)
    consumed = [line for line in out.stdout.splitlines() if re.match(r"broker-a/\d@\d+ ", line)]
    assert len(consumed) == 100, "alice consumed the 100 messages she produced"
    assert "not yet enforced" not in out.stderr


#: The operator's sections, run one after another on a cluster of their own: retention, operating,
#: watching and metrics. `tide top` (live until Ctrl-C) is shown once instead.
OPERATOR_SECTIONS = (
    "A topic may keep its messages for a time of its own",
    "Operating a cluster: topics, brokers, maintenance",
    "Watching a cluster: `tide top` and JSON logs",
    "Metrics and health checks",
)
OPERATOR = {
    "tide top                                  # live": "tide top --once                           # live"
}


def test_the_operator_sections_run_as_shown(tmp_path: Path) -> None:
    setup = (
        "tide cluster up --data-dir ./tide-data --quiet > /dev/null\n"
        'export TIDE_CONTROLLERS="$(jq -r .controllers tide-data/cluster.json)"\n'
        "tide topic create orders\n"
    )
    script = "\n".join(block("sh", after) for after in OPERATOR_SECTIONS)
    out = run_script(setup + shown(script, OPERATOR), tmp_path)
    assert "broker 2 is the master already" in out.stderr  # the second drain, as the README shows it
    assert out.stdout.rstrip().endswith("200"), "the broker's /readyz answered 200"


def test_the_retention_keys_shown_are_a_valid_broker_section() -> None:
    import yaml

    from tidelog.broker.config import from_mapping

    shown = yaml.safe_load(block("yaml", "Retention: how long the log keeps messages"))["broker"]
    cfg = from_mapping(
        {"broker_set": "a", "data_dir": "d", "controllers": "127.0.0.1:1", "secret": "s", **shown}
    )
    assert (cfg.retention_ms, cfg.retention_bytes) == (86_400_000, 100 << 30)
    assert tuple(cfg.retention_respect_groups) == ("billing",)


#: The placement block on a broker set of four: its two broker commands each need a stopped broker
#: (2 and 3), stopped first by the test (by id: which process registered as which id varies).
PLACEMENT = {
    "tide placement audit [--json]": "tide placement audit --json",
    "tide placement status [--json]": "tide placement status --json",
    "tide broker decommission 2": (
        "for id in 2 3; do\n"
        '  addr="$(tide broker list --json | jq -r ".[] | select(.id == $id) | .address")"\n'
        '  tide fault kill "$(jq -r --arg a "$addr" \'.processes[] | select(.address == $a) | .name\' '
        'tide-data/cluster.json)" > /dev/null\n'
        "done\n"
        "until tide broker list --json | jq -e '[.[] | select((.id == 2 or .id == 3) and .alive == false)] "
        "| length == 2' > /dev/null; do sleep 0.2; done\n"
        "tide broker decommission 2"
    ),
}


def test_the_placement_section_runs_as_shown(tmp_path: Path) -> None:
    topology = tmp_path / "four.yaml"
    topology.write_text((REPO / "deploy" / "local.yaml").read_text().replace("replicas: 2", "replicas: 4"))
    setup = (
        f"tide cluster up -c {topology} --data-dir ./tide-data --quiet > /dev/null\n"
        'export TIDE_CONTROLLERS="$(jq -r .controllers tide-data/cluster.json)"\n'
    )
    script = block("sh", "Placement: is every broker set held in both datacenters?")
    out = run_script(setup + shown(script, PLACEMENT), tmp_path)
    assert '"violations": []' in out.stdout, "the audit of a healthy set is clean"
    assert "broker 2 decommissioned" in out.stdout and "broker 3 replaced by broker 4" in out.stdout
