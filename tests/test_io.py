"""Crash-safe writes and checkpoint reading errors."""

from __future__ import annotations

import pytest
import torch

from snntrain.checkpoint import CheckpointError, read_checkpoint
from snntrain.fileio import atomic_path


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
    with atomic_path(target, is_dir=True) as tmp:
        (tmp / "weights").write_text("2")
    assert (target / "weights").read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["export"]


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
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.ckpt")
    with pytest.raises(CheckpointError, match="foreign.ckpt has no 'state_dict'"):
        read_checkpoint(tmp_path / "foreign.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "lightning.ckpt")
    with pytest.raises(CheckpointError, match="carries no snntrain run config"):
        read_checkpoint(tmp_path / "lightning.ckpt")
    assert read_checkpoint(tmp_path / "ok.ckpt")["state_dict"] == {}
