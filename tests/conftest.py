"""Shared fixtures: processes on free loopback ports, always stopped by the test that started them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.procs import CLUSTER_SECRET, ControllerCluster, Proc
from tidelog.localcluster.procs import PORT_SLICE_ENV

# The tests act as brokers and operators of their own clusters: their controller clients sign
# membership calls with the clusters' secret, as `tide` commands do with $TIDE_CLUSTER_SECRET.
os.environ["TIDE_CLUSTER_SECRET"] = CLUSTER_SECRET

# Under pytest-xdist (`make test` runs the Makefile's TEST_WORKERS workers) each worker, and every
# process it starts, draws free ports from a slice of the range of its own: see
# tidelog.localcluster.procs.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ[PORT_SLICE_ENV] = (
        f"{os.environ['PYTEST_XDIST_WORKER'].removeprefix('gw')}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"
    )


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Factory: `procs(name, args)` starts `python -m tidelog.cli *args`; all are stopped at teardown."""
    started: list[Proc] = []

    def start(name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, args, tmp_path / f"{name}.log", env).start()
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


@pytest.fixture
def controller_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ControllerCluster]]:
    """Factory: `controller_cluster(size, **options)` starts a controller cluster of processes
    (`start=False`: only writes its config, for tests that start nodes themselves).

    Every process is stopped at teardown (SIGTERM, then SIGKILL); on failure their logs are shown.
    """
    clusters: list[ControllerCluster] = []

    def start(size: int = 3, *, start: bool = True, **options: Any) -> ControllerCluster:
        root = tmp_path / f"cluster{len(clusters)}"
        root.mkdir()
        c = ControllerCluster(root, size, **options)
        clusters.append(c)
        return c.start() if start else c

    yield start
    failed = getattr(request.node, "rep_call", None)
    for c in clusters:
        c.stop()
        if failed is not None and failed.failed:
            print(c.logs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    # Keep each phase's report on the item so fixtures can print logs only when a test failed.
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


# The longest modules (minutes each: the network lab's drills, the Spark jobs, the official
# RocketMQ clients, the README's blocks) go to the workers first. `--dist loadscope` hands out
# modules in collection order, so left in alphabetical order they started last and the run waited
# minutes for them at the end; first, the short modules fill the workers' gaps around them.
# In this order: the lab's modules mostly wait (each fault is held, then healed, for seconds) and
# the Spark and RocketMQ modules keep the cores busy, so they alternate. Started together, the
# three lab modules left the cores 30-50% idle for the run's first two minutes.
LONGEST_FIRST = (
    "tests/lab/test_recover_lab",
    "tests/spark/",
    "tests/client/test_rocketmq_push",
    "tests/lab/test_lab",
    "tests/client/test_rocketmq_node",
    "tests/lab/",
    "tests/client/test_rocketmq",
    "tests/cli/test_readme_blocks",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def module(item: pytest.Item) -> str:
        return item.nodeid.partition("::")[0]

    # whole modules move (their module-scoped clusters start once): a module with any slow test
    # counts as slow
    slow = {module(i) for i in items if i.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        path = module(item)
        first = next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), None)
        if first is not None:
            return first
        return len(LONGEST_FIRST) + (0 if path in slow else 1)

    items.sort(key=rank)  # stable: within a rank, the collection order


# Every Spark module runs on one worker, one after the other. Each worker that runs a Spark test
# starts a JVM and a SparkSession of its own (tests/spark/conftest.py: one per pytest process),
# and with modules handed out one by one the Spark modules landed on every worker, which then
# started a JVM each at once at the start of the run. `tests/spark` as one scope starts one.
SHARED_SCOPES = ("tests/spark/",)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own scheduler for its other modes
    from xdist.scheduler import LoadScopeScheduling

    class SharedScopeScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            for shared in SHARED_SCOPES:
                if nodeid.startswith(shared):
                    return shared
            return str(super()._split_scope(nodeid))

    return SharedScopeScheduling(config, log)
