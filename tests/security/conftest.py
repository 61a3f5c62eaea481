"""A cluster of deploy/secure.yaml (TLS on every port, users' auth on) per test module, started by
`tide cluster up` under an operator's usual umask, and the helpers that reach its ports."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.client.conftest import REPO, LocalCluster, start_cluster, stop_cluster
from tidelog.credentials import Credentials

SECURE = REPO / "deploy" / "secure.yaml"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    old = os.umask(0o022)  # an operator's usual umask: the files must be private anyway
    try:
        c = start_cluster(tmp_path_factory.mktemp("secure") / "tide-data", SECURE)
    finally:
        os.umask(old)
    try:
        yield c
    finally:
        stop_cluster(c)


def admin(c: LocalCluster) -> Credentials:
    creds = c.up_doc["credentials"]
    return Credentials(creds["access_key"], creds["secret_key"])


def tls_channel(c: LocalCluster, address: str) -> grpc.Channel:
    """A channel to `address` that trusts the cluster's CA (no client certificate: not mutual TLS)."""
    ca = Path(c.up_doc["ca_file"]).read_bytes()
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca))


def raw_call(channel: grpc.Channel, method: str) -> Any:
    """A unary call of `method` that sends and returns bytes as they are (no protobuf)."""
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def broker_config(c: LocalCluster, name: str = "broker-a-0") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((c.data_dir / f"{name}.yaml").read_text())
    return doc


def controller_address(c: LocalCluster) -> str:
    return str(c.controllers.split(",")[0])
