"""Pieces shared by the face-detection datasets: sample format, box-aware transforms, batching.

Sample format
-------------
Every detection dataset returns ``(image, target)``:

* ``image``: float32 tensor ``[3, S, S]``, RGB, normalised as ``(pixel / 255 - 0.5) / 0.5``, so values lie
  in ``[-1, 1]`` with mid grey at about 0 (see :func:`normalize_image`). Letterbox padding is exactly 0.
* ``target``: a dict with

  - ``"boxes"``: float32 ``[n, 4]``, ``(x1, y1, x2, y2)`` in pixels of the returned image, ``x2``/``y2``
    exclusive (a box covering pixel columns 3..7 is ``x1=3, x2=8``);
  - ``"labels"``: int64 ``[n]``, all 0 (the single class "face");
  - ``"image_id"``: int, the index of the image in its dataset;
  - ``"orig_size"``: ``(h, w)`` of the image before resizing;
  - ``"scale"``, ``"pad"``: float32 ``[2]`` each, ``(x, y)``: a point of the original image maps to
    ``original * scale + pad`` in the returned one (:func:`boxes_to_original` inverts it). For randomly
    augmented training samples the mapping is not tracked and both are NaN.

Batches
-------
:func:`collate_detection` stacks images to ``[B, 3, S, S]`` and pads the boxes to ``[B, M, 4]`` (zeros,
so a padding row has ``y2 = 0``), the labels to ``[B, M]`` (-1) and adds ``"num_boxes"`` ``[B]``; every
field is a tensor, so a loss never needs to read anything back to the host.

Modules: :mod:`~snntrain.data.detection.images` (normalisation, letterbox, reading, mapping back),
:mod:`~snntrain.data.detection.transforms`, :mod:`~snntrain.data.detection.collate`,
:mod:`~snntrain.data.detection.resident` (a training set kept on the device),
:mod:`~snntrain.data.detection.datamodule` (the datamodule the detection datasets share) and
:mod:`~snntrain.data.detection.settings` (checks of the settings); every public name is importable from here.
"""

from .collate import DetectionCollate, collate_detection, select_boxes
from .datamodule import DetectionDataModule, make_target
from .images import (
    IMAGE_MEAN,
    IMAGE_STD,
    boxes_to_original,
    denormalize_image,
    fit_long_side,
    letterbox,
    load_image_for_detection,
    normalize_image,
    pad_images,
    read_rgb,
)
from .transforms import SquareCropTransform, TrainTransform, box_area

__all__ = [
    "IMAGE_MEAN",
    "IMAGE_STD",
    "DetectionCollate",
    "DetectionDataModule",
    "SquareCropTransform",
    "TrainTransform",
    "box_area",
    "boxes_to_original",
    "collate_detection",
    "denormalize_image",
    "fit_long_side",
    "letterbox",
    "load_image_for_detection",
    "make_target",
    "normalize_image",
    "pad_images",
    "read_rgb",
    "select_boxes",
]
