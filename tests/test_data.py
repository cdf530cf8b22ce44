"""Classification datamodules: the bundled digits, CIFAR-10's missing-data message, image folders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from snntrain.data import CIFAR10DataModule, DigitsDataModule, ImageFolderDataModule, build_datamodule


def test_digits_split_is_deterministic_and_stratified():
    a, b = DigitsDataModule(seed=3), DigitsDataModule(seed=3)
    a.setup(), b.setup()
    xa, ya = a.train_set.tensors
    assert xa.shape == (1437, 1, 16, 16) and len(a.val_set) == 360
    assert torch.equal(xa, b.train_set.tensors[0]) and torch.equal(ya, b.train_set.tensors[1])
    counts = torch.bincount(a.val_set.tensors[1], minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # 20% of each class
    c = DigitsDataModule(seed=4)
    c.setup()
    assert not torch.equal(c.val_set.tensors[1], a.val_set.tensors[1])
    x, y = next(iter(a.train_dataloader()))
    assert x.shape == (64, 1, 16, 16) and y.dtype == torch.int64
    assert -1.0 <= x.min() and x.max() <= 1.0


def test_digits_image_size_and_validation():
    dm = DigitsDataModule(image_size=8)
    dm.setup()
    assert dm.train_set.tensors[0].shape[-1] == 8
    with pytest.raises(ValueError, match="val_fraction=1.5 must be a number strictly between 0 and 1"):
        DigitsDataModule(val_fraction=1.5)
    with pytest.raises(ValueError, match="batch_size=0 must be a positive integer"):
        DigitsDataModule(batch_size=0)


def test_cifar10_missing_names_folder_to_fill(tmp_path):
    dm = CIFAR10DataModule(root=str(tmp_path / "cifar"), download=False)
    with pytest.raises(RuntimeError, match=r"CIFAR-10 is not in .*cifar \(download=false\).*cifar-10-python.tar.gz"):
        dm.prepare_data()


def _write_images(root, classes=("cat", "dog"), n=5):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


def test_image_folder_split_and_loaders(tmp_path):
    _write_images(tmp_path)
    dm = build_datamodule({"name": "image_folder", "root": str(tmp_path), "image_size": 16, "in_channels": 1,
                           "batch_size": 4, "num_workers": 0, "val_fraction": 0.2, "num_classes": None}, seed=1)
    assert isinstance(dm, ImageFolderDataModule) and dm.num_classes == 2 and dm.classes == ["cat", "dog"]
    dm.setup()
    assert len(dm.train_set) == 8 and len(dm.val_set) == 2
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (2, 1, 16, 16)


def test_image_folder_train_val_layout_and_errors(tmp_path):
    _write_images(tmp_path / "train")
    _write_images(tmp_path / "val", n=2)
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=12, batch_size=2, num_workers=0)
    dm.setup()
    assert len(dm.val_set) == 4
    with pytest.raises(ValueError, match="needs data.root"):
        ImageFolderDataModule(root=None)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        ImageFolderDataModule(root=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="has 1 class folder"):
        (tmp_path / "one" / "only").mkdir(parents=True)
        ImageFolderDataModule(root=str(tmp_path / "one"))


def test_unknown_dataset_is_named():
    with pytest.raises(ValueError, match="data name='mnist' is not valid; choose one of digits, cifar10, image_folder"):
        build_datamodule({"name": "mnist"})


@pytest.mark.parametrize("bad", [-1, 1.5, True, "four", None])
def test_bad_num_workers_is_named(bad):
    from snntrain.data.common import check_num_workers

    with pytest.raises(ValueError, match=r"data.num_workers=.* must be an integer >= 0 or auto"):
        check_num_workers(bad)


def test_auto_workers_only_where_the_step_runs_on_a_gpu(monkeypatch):
    import os

    from snntrain.data.common import check_num_workers, resolve_num_workers

    assert check_num_workers("auto") == "auto" and check_num_workers(0) == 0
    assert resolve_num_workers("auto", None) == 0  # no trainer yet
    assert resolve_num_workers("auto", torch.device("cpu")) == 0
    assert resolve_num_workers(3, torch.device("cpu")) == 3  # a number is kept anywhere
    for cores, expected in ((16, 4), (3, 2), (1, 0)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert resolve_num_workers("auto", torch.device("cuda", 0)) == expected


class _ImagesAndTargets(torch.utils.data.Dataset):
    def __init__(self, side: int = 160) -> None:
        self.side = side

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((3, self.side, self.side), float(i)), {"boxes": torch.full((2, 4), float(i)), "image_id": i}


def test_small_tensors_leave_loader_processes_inside_the_pickle():
    # a shared-memory segment per tensor costs the training process a socket hand-over each; only the images
    # (4 x 3 x 160 x 160 float32, above INLINE_BYTES) take that path, the batch is the same as without loader processes
    from snntrain.data.common import DeviceLoader

    single = list(DeviceLoader(_ImagesAndTargets(), batch_size=4, num_workers=0))
    multi = list(DeviceLoader(_ImagesAndTargets(), batch_size=4, num_workers=2))
    assert len(single) == len(multi) == 2
    for (xa, ta), (xb, tb) in zip(single, multi):
        assert type(ta) is type(tb) is dict and ta.keys() == tb.keys()
        torch.testing.assert_close(xa, xb)
        for key in ta:
            torch.testing.assert_close(ta[key], tb[key])
    images, targets = multi[0]
    assert images.is_shared() and not targets["boxes"].is_shared() and not targets["image_id"].is_shared()
    # a detector's batch of small images (4 x 3 x 64 x 64 float32, 192 KiB) travels inside the pickle as a whole
    images, targets = next(iter(DeviceLoader(_ImagesAndTargets(64), batch_size=4, num_workers=1)))
    assert not images.is_shared() and not targets["boxes"].is_shared()
    torch.testing.assert_close(images, single[0][0][:, :, :64, :64])


def test_evaluation_loaders_hand_out_batches_on_the_trainers_device(tmp_path):
    """Every datamodule's validation loader is an :func:`eval_loader`: the dataset in order, and on a CUDA
    trainer a DeviceLoader bound to that device (pinned, copied one batch ahead, like the training loader);
    without a trainer it hands out the host batches as a plain loader would."""
    from types import SimpleNamespace

    from snntrain.data.common import DeviceLoader
    from snntrain.data.faces import FacesDataModule
    from snntrain.data.synthetic import SyntheticDataModule

    _write_images(tmp_path / "train")
    _write_images(tmp_path / "val", n=2)
    modules = {
        "digits": DigitsDataModule(batch_size=8),
        "synthetic": SyntheticDataModule(num_train=8, num_val=6, image_size=8, pool_size=8, batch_size=4),
        "synthetic frames": SyntheticDataModule(num_train=8, num_val=6, image_size=8, pool_size=8, batch_size=4,
                                                frames=2),
        "image folder": ImageFolderDataModule(root=str(tmp_path), image_size=12, batch_size=2, num_workers=0),
        "faces": FacesDataModule(num_train=4, num_val=4, num_test=4, batch_size=2, seed=7),
    }
    for name, dm in modules.items():
        dm.setup("fit")
        loader = dm.val_dataloader()
        assert isinstance(loader, DeviceLoader) and loader.device is None and not loader.pin_memory, name
        first = next(iter(loader))
        x = first[0]
        frames = 2 if name == "synthetic frames" else None
        expected = torch.stack([dm.val_set[i][0] for i in range(x.shape[1] if frames else x.shape[0])])
        assert torch.equal(x.transpose(0, 1) if frames else x, expected), name  # in dataset order
        dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
        loader = dm.val_dataloader()
        assert isinstance(loader, DeviceLoader) and loader.device == torch.device("cuda", 0), name
        assert loader.pin_memory and not isinstance(loader.sampler, torch.utils.data.RandomSampler), name
