"""Crash-safe writes and checkpoint reading errors."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from snntrain.checkpoint import CheckpointError, read_checkpoint
from snntrain.fileio import atomic_path, umask


def test_atomic_path_replaces_only_on_success(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half-writ")
            raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"


def test_atomic_dir(tmp_path):
    target = tmp_path / "export"
    with pytest.raises(KeyError):
        with atomic_path(target, is_dir=True) as tmp:
            (tmp / "weights").write_text("x")
            raise KeyError("bad")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_path(target, is_dir=True) as tmp:
        (tmp / "weights").write_text("1")
        (tmp / "graph").write_text("g")
    (target / "notes.txt").write_text("mine")
    with atomic_path(target, is_dir=True) as tmp:
        (tmp / "weights").write_text("2")
    # into an existing folder: the files of the same name are replaced, every other file stays
    assert (target / "weights").read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["export"]
    assert (target / "graph").read_text() == "g" and (target / "notes.txt").read_text() == "mine"
    with pytest.raises(RuntimeError), atomic_path(target, is_dir=True) as tmp:
        (tmp / "graph").write_text("half")
        raise RuntimeError("crash")
    assert (target / "graph").read_text() == "g" and [p.name for p in tmp_path.iterdir()] == ["export"]


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_atomic_writes_get_the_umask_mode(tmp_path, umask_027):
    """Files and folders written through atomic_path get the mode open() and mkdir() would give them (the umask's,
    or a replaced file's own), not tempfile's 0o600 / 0o700, whatever mode their writer gave them."""
    assert umask() == 0o027
    with atomic_path(tmp_path / "config.yaml") as tmp:
        tmp.write_text("a: 1")
    assert stat.S_IMODE((tmp_path / "config.yaml").stat().st_mode) == 0o640
    with atomic_path(tmp_path / "export", is_dir=True) as tmp:
        fd = os.open(tmp / "model.safetensors", os.O_CREAT | os.O_WRONLY, 0o600)  # as safetensors writes it
        os.close(fd)
    assert stat.S_IMODE((tmp_path / "export").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "export" / "model.safetensors").stat().st_mode) == 0o640
    os.chmod(tmp_path / "config.yaml", 0o664)  # a file that is replaced keeps its mode, as open(path, "w") keeps it
    with atomic_path(tmp_path / "config.yaml") as tmp:
        tmp.write_text("a: 2")
    assert stat.S_IMODE((tmp_path / "config.yaml").stat().st_mode) == 0o664


def test_read_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="missing.ckpt does not exist"):
        read_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.ckpt is empty"):
        read_checkpoint(tmp_path / "empty.ckpt")
    torch.save({"state_dict": {}, "hyper_parameters": {"config": {"model": {}, "task": {}}}}, tmp_path / "ok.ckpt")
    data = (tmp_path / "ok.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.ckpt cannot be read.*truncated"):
        read_checkpoint(tmp_path / "cut.ckpt")
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError) as err:  # one line, without PyTorch's paragraph on weights_only
        read_checkpoint(tmp_path / "text.ckpt")
    message = str(err.value)
    assert "\n" not in message and len(message) - len(str(tmp_path)) < 150 and "text.ckpt cannot be read" in message
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.ckpt")
    with pytest.raises(CheckpointError, match="foreign.ckpt has no 'state_dict'"):
        read_checkpoint(tmp_path / "foreign.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "lightning.ckpt")
    with pytest.raises(CheckpointError, match="carries no snntrain run config"):
        read_checkpoint(tmp_path / "lightning.ckpt")
    assert read_checkpoint(tmp_path / "ok.ckpt")["state_dict"] == {}
