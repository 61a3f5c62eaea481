"""The command line as a newcomer meets it: the local-cluster fixtures of tests/client (a cluster
started with `tide cluster up`, every `tide` a subprocess of the installed console script)."""

from tests.client.conftest import cluster, cluster_factory, pytest_runtest_makereport

__all__ = ["cluster", "cluster_factory", "pytest_runtest_makereport"]
