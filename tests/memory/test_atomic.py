"""Atomic writes: old file or complete new file, never a mix; sensible permissions."""

from __future__ import annotations

import os
import stat

import pytest

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError


def test_new_file_gets_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.bin") as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644


def test_replaced_file_keeps_its_permissions(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    with atomic_write(target, force=True) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_failure_leaves_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(target, force=True) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_refuses_existing_without_force_and_missing_folder(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(NphError, match="--force"), atomic_write(target):
        pass
    with pytest.raises(NphError, match="does not exist"), atomic_write(tmp_path / "no" / "a"):
        pass
    assert target.read_bytes() == b"old"


def test_unwritable_place_is_a_user_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkdtemp", refuse)
    with pytest.raises(NphError, match="cannot write .*Permission denied"):
        with atomic_write(tmp_path / "a.bin") as tmp:
            tmp.write_bytes(b"x")
