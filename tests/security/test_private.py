"""Private files (tidelog/private.py) and users' signing keys wrapped under the cluster secret
(tidelog/access.py): the pure parts, in one process."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog import access, acl, private
from tidelog.commitlog import CommitLog, Message
from tidelog.errors import InsecurePermissionsError
from tidelog.guard import with_clear_keys


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def test_private_dir_file_and_write_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):
        d = private.private_dir(tmp_path / "a" / "b")
        fd = private.open_private(d / "f", os.O_WRONLY | os.O_CREAT)
        os.close(fd)
        private.write_private(d / "w", b"x")
    assert mode(tmp_path / "a") == 0o700 and mode(d) == 0o700
    assert mode(d / "f") == 0o600 and mode(d / "w") == 0o600
    (d / "loose").write_bytes(b"")
    os.chmod(d / "loose", 0o644)
    os.close(private.open_private(d / "loose", os.O_RDWR | os.O_CREAT))
    assert mode(d / "loose") == 0o600  # tightened when opened for writing


def test_commitlog_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):
        log = CommitLog.open(tmp_path / "data", segment_bytes=1 << 20)
        try:
            log.append([Message("t", 0, b"hello", key="k")])
        finally:
            log.close()
    for root, dirs, files in os.walk(tmp_path / "data"):
        for name in dirs:
            assert mode(Path(root) / name) == 0o700, name
        for name in files:
            assert mode(Path(root) / name) == 0o600, name
    assert mode(tmp_path / "data") == 0o700


def test_require_private_refuses_readable_files_and_full_dirs_and_tightens_empty_dirs(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("k")
    os.chmod(key, 0o644)
    with pytest.raises(InsecurePermissionsError) as err:
        private.require_private(key, "TLS key")
    assert err.value.code == "INSECURE_PERMISSIONS" and "chmod 600" in str(err.value)
    os.chmod(key, 0o600)
    private.require_private(key, "TLS key")

    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    os.chmod(full, 0o755)
    with pytest.raises(InsecurePermissionsError, match="go-rwx"):
        private.require_private(full, "data directory")

    empty = tmp_path / "empty"
    empty.mkdir()
    os.chmod(empty, 0o755)
    private.require_private(empty, "data directory")
    assert mode(empty) == 0o700
    private.require_private(tmp_path / "missing", "data directory")  # made private when created


KEY = access.signing_key("s3cret", "AKalice1", iterations=1)


@given(secret=st.text(min_size=1, max_size=40), ak=st.from_regex(r"[A-Za-z0-9]{4,20}", fullmatch=True))
def test_a_wrapped_key_unwraps_under_its_secret_only(secret: str, ak: str) -> None:
    wrapped = access.wrap_signing_key(secret, ak, KEY, os.urandom(16))
    assert KEY not in wrapped and access.is_stored_key(wrapped)
    assert access.unwrap_signing_key(secret, ak, wrapped) == KEY
    assert access.unwrap_signing_key(secret + "x", ak, wrapped) is None
    assert access.unwrap_signing_key(secret, ak + "x", wrapped) is None  # bound to its access key
    flipped = wrapped[:-1] + ("0" if wrapped[-1] != "0" else "1")
    assert access.unwrap_signing_key(secret, ak, flipped) is None


def test_keys_stored_in_clear_by_an_older_version_still_sign() -> None:
    table = acl.AclState(3, {"alice": acl.User("alice", "AKalice1", KEY)}, frozenset())
    assert with_clear_keys(table, "any").users["alice"].signing_key == KEY
    wrapped = acl.AclState(
        3,
        {"alice": acl.User("alice", "AKalice1", access.wrap_signing_key("s", "AKalice1", KEY, bytes(16)))},
        frozenset(),
    )
    assert with_clear_keys(wrapped, "s").users["alice"].signing_key == KEY
    assert "alice" not in with_clear_keys(wrapped, "other").users  # signs nothing here
