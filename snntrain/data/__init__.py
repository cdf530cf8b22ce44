"""LightningDataModules, built by name from the ``data`` config group."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import lightning as L

from ..validation import one_of, unknown_setting
from .cifar10 import CIFAR10DataModule
from .cifar100 import CIFAR100DataModule
from .digits import DigitsDataModule
from .digits_dvs import DigitsDVSDataModule
from .events import CIFAR10DVSDataModule, DVSGestureDataModule, NCaltech101DataModule, NMNISTDataModule
from .faces import FacesDataModule
from .image_folder import ImageFolderDataModule
from .synthetic import SyntheticDataModule
from .widerface import WiderFaceDataModule

DATAMODULES: dict[str, type[L.LightningDataModule]] = {
    "digits": DigitsDataModule,
    "cifar10": CIFAR10DataModule,
    "image_folder": ImageFolderDataModule,
    "faces": FacesDataModule,
    "widerface": WiderFaceDataModule,
    "synthetic": SyntheticDataModule,
    "cifar100": CIFAR100DataModule,
    # event cameras: [T, 2, H, W] frames, batched time-first
    "digits_dvs": DigitsDVSDataModule,
    "nmnist": NMNISTDataModule,
    "dvs_gesture": DVSGestureDataModule,
    "cifar10_dvs": CIFAR10DVSDataModule,
    "ncaltech101": NCaltech101DataModule,
}

# Keys of a data config that describe the data for the model rather than configure the module.
_DESCRIPTIVE = ("name", "num_classes", "in_channels", "classes")


def build_datamodule(cfg: Mapping[str, Any], seed: int = 0) -> L.LightningDataModule:
    """Build the datamodule that ``cfg`` names; other keys are its arguments."""
    cfg = dict(cfg)
    name = cfg.get("name")
    one_of("data name", name, DATAMODULES)
    cls = DATAMODULES[name]
    kwargs = {k: v for k, v in cfg.items() if k not in _DESCRIPTIVE}
    # descriptive keys that a datamodule also takes as settings (image_folder: in_channels; synthetic: both)
    accepted = inspect.signature(cls).parameters
    for key in ("num_classes", "in_channels"):
        if key in accepted and cfg.get(key) is not None:
            kwargs[key] = cfg[key]
    kwargs.setdefault("seed", seed)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise unknown_setting("data", f"data={name}", err, cls) from None


__all__ = [
    "DATAMODULES",
    "CIFAR10DVSDataModule",
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "DVSGestureDataModule",
    "DigitsDVSDataModule",
    "DigitsDataModule",
    "FacesDataModule",
    "ImageFolderDataModule",
    "SyntheticDataModule",
    "NCaltech101DataModule",
    "NMNISTDataModule",
    "WiderFaceDataModule",
    "build_datamodule",
]
