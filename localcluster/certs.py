"""Throwaway certificates for a local cluster: one CA, and a certificate per process it signs.

`tide cluster up` with a topology's `tls:` section (deploy/secure.yaml) calls `make_ca` and
`issue` to write PEM files under `<data-dir>/tls/`: `ca.pem` (what clients are given as
`$TIDE_CA_FILE`), `ca.key` (kept, so that a certificate can be renewed and reloaded with SIGHUP),
and `<name>.pem` / `<name>.key` for each controller, broker and the local client. Keys are EC
P-256 and written readable by their owner only. These certificates are for a cluster on one
machine: production certificates come from the operator's own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidelog.private import private_dir, write_private

VALID_DAYS = 30


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    serial: int


@dataclass(frozen=True)
class Authority:
    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(directory: Path, name: str = "ca", common_name: str = "tidelog local CA") -> Authority:
    """A self-signed CA: `<name>.pem` and `<name>.key` in `directory`."""
    private_dir(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    out = Authority(directory / f"{name}.pem", directory / f"{name}.key")
    write_private(out.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out.key, key)
    return out


def _alt_names(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, "localhost", "127.0.0.1"]):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def issue(ca: Authority, directory: Path, name: str, hosts: list[str]) -> Issued:
    """A certificate for `hosts` (and localhost) signed by `ca`, usable by a server and as a client
    certificate (cluster members are both): `<name>.pem` and `<name>.key` in `directory`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(_alt_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    private_dir(directory)
    out = Issued(directory / f"{name}.pem", directory / f"{name}.key", serial)
    # the key first: a reload that reads the new certificate finds its key already there
    tmp_key, tmp_cert = out.key.with_suffix(".key.new"), out.cert.with_suffix(".pem.new")
    _write_key(tmp_key, key)
    write_private(tmp_cert, cert.public_bytes(serialization.Encoding.PEM))
    tmp_key.replace(out.key)
    tmp_cert.replace(out.cert)
    return out


@dataclass(frozen=True)
class ClusterCerts:
    """The certificates of one local cluster: the CA, one pair per process name, and the client's."""

    ca: Authority
    issued: dict[str, Issued]
    require_client_cert: bool

    def section(self, name: str) -> dict[str, Any]:
        """The `tls:` section of process `name`'s config (deploy/CONFIG.md)."""
        pair = self.issued[name]
        return {
            "cert": str(pair.cert),
            "key": str(pair.key),
            "ca": str(self.ca.cert),
            "require_client_cert": self.require_client_cert,
        }

    @property
    def client(self) -> Issued:
        return self.issued[CLIENT]


CLIENT = "client"


def for_cluster(directory: Path, hosts: dict[str, list[str]], require_client_cert: bool) -> ClusterCerts:
    """A fresh CA in `directory` and a certificate for each process name (`hosts`: name -> the
    hosts it is reached at) and for the local client (`client.pem`, used with mutual TLS)."""
    ca = make_ca(directory)
    issued = {name: issue(ca, directory, name, h) for name, h in {**hosts, CLIENT: []}.items()}
    return ClusterCerts(ca, issued, require_client_cert)
