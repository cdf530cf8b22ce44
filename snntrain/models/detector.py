"""Spiking FCOS-style detector: SEW-ResNet backbone, spiking feature pyramid, spiking head.

The backbone's stage outputs (spikes, ``[T, B, C, H, W]``) feed a small feature pyramid
(lateral 1x1 convolutions, top-down nearest upsampling and sums, then conv-norm-neuron).
A head shared by all levels has two towers of conv-norm-neuron layers (classification
and box) and three prediction convolutions: per-location class logits, ``ltrb``
distances and centerness (Tian et al., FCOS, 2019).

Readout. The prediction convolutions are linear in their spike inputs; their outputs
are read either as the **membrane** potential of a non-leaky integrator averaged over
T (``readout="membrane"``: the mean over T of the convolution output, real-valued), or
as **rate**s of spiking read-out neurons mapped by a learned per-channel affine map
(``readout="rate"``). Rates take only T + 1 values per location, which quantises the
scores and box distances; docs/experiments.md records the comparison that made
``membrane`` the default.

Everything from the input to the losses is tensor code without host synchronisation;
only :meth:`SpikingFCOS.decode` (inference: thresholding and NMS) leaves the device.

Multi-scale inference. A detector knows the object sizes it was trained on (``object_sizes``, pixels of
its input) and its training image size (``train_size``). :meth:`SpikingFCOS.detect` runs an image at a
pyramid of scales (:func:`pyramid_scales`: from the scale at which objects of ``min_object`` times the
image's shorter side have the smallest trained size, never above the image's own pixels, down to the
training square, a factor ``scale_step`` apart), so that objects of any size in a photograph pass
through the network at a size it has learned. Each scale keeps the boxes whose size lies in the trained
range there (the finest scale also smaller ones, the coarsest also larger ones); the boxes, mapped back
to the image's pixels, are merged by NMS or by voting across scales (``merge``). A scaled image larger
than ``tile_size`` is cut into overlapping tiles, run one at a time, so memory is bounded by the tile,
not the photograph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.layers import MultiStep
from ..nn.neurons import build_neuron
from ..validation import flag, number, one_of, positive_int
from .common import LayerFactory
from .sew_resnet import SEWResNet

READOUTS = ("membrane", "rate")
#: How the boxes of a pyramid's scales are merged: ``nms`` keeps the best of overlapping boxes; ``vote``
#: averages overlapping boxes weighted by their scores and scores the result by the mean of its best
#: :data:`VOTE_SCALES` scales' scores (a scale that should have seen it but did not counts 0).
MERGES = ("nms", "vote")
VOTE_SCALES = 3
#: Per scale of a pyramid, boxes are kept when their size (square root of the area, pixels of the scaled
#: image) lies within the trained object sizes widened by these factors (SNIP's valid ranges); the finest
#: scale has no lower and the coarsest no upper limit.
VALID_RANGE_SLACK = (0.75, 1.25)


def pyramid_scales(height: int, width: int, train_size: int, step: float = 2.0, finest: float = 1.0) -> list[float]:
    """Scales (factors of an image of ``height`` x ``width``) of the pyramid a detector trained on
    ``train_size`` x ``train_size`` images runs it at: from ``finest`` (1: the image's own pixels) down to
    the scale that fits it into the training square, geometrically, adjacent scales at most ``step`` apart.
    An image no larger than the training square gets that one scale (the single pass of training)."""
    coarsest = train_size / max(height, width)
    if coarsest >= finest:
        return [coarsest]
    n = math.ceil(math.log(finest / coarsest) / math.log(step) - 1e-9)
    return [finest * (coarsest / finest) ** (k / n) for k in range(n + 1)]


def finest_scale(height: int, width: int, smallest_trained: float, min_object: float) -> float:
    """The finest scale of the auto pyramid: the one at which an object of ``min_object`` times the image's
    shorter side has the smallest trained size ``smallest_trained``; never above 1 (the image's own pixels).
    ``min_object`` 0: scale 1."""
    if min_object <= 0:
        return 1.0
    return min(1.0, smallest_trained / (min_object * min(height, width)))


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start offsets of tiles of ``tile`` pixels covering ``length`` pixels, adjacent tiles overlapping by
    at least ``overlap`` pixels, spread evenly (the first at 0, the last ending at ``length``)."""
    if length <= tile:
        return [0]
    n = math.ceil((length - tile) / max(1, tile - overlap)) + 1
    return [round(i * (length - tile) / (n - 1)) for i in range(n)]


def check_scales(name: str, value: object) -> str | list[float]:
    """``auto``, or the scale factors ``value`` sorted finest first without repeats; else a ValueError."""
    if value == "auto":
        return "auto"
    if (isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 16 for v in value)):
        raise ValueError(f"{name}={value!r} is not valid; give auto or a non-empty list of scale factors in (0, 16] "
                         "(1: the image as given)")
    return sorted({float(v) for v in value}, reverse=True)


def _upsample_to(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    t, b = x.shape[:2]
    return F.interpolate(x.flatten(0, 1), size=tuple(size), mode="nearest").unflatten(0, (t, b))


class SpikingFPN(nn.Module):
    """Feature pyramid over spike maps; outputs are spike maps with ``channels`` channels. ``in_max``: each input map
    is integers in ``[0, in_max[i]]`` (spikes or SEW ADD's counts; None: not known), the bound its lateral convolution
    is built with (:meth:`LayerFactory.conv2d`); the output convolutions read sums of currents."""

    def __init__(self, in_channels: Sequence[int], channels: int, f: LayerFactory,
                 in_max: Sequence[int | None] | None = None) -> None:
        super().__init__()
        in_max = [None] * len(in_channels) if in_max is None else list(in_max)
        self.lateral = nn.ModuleList(MultiStep(f.conv2d(c, channels, 1, bias=True, input_max=m))
                                     for c, m in zip(in_channels, in_max))
        self.output = nn.ModuleList(f.conv(channels, channels, 3) for _ in in_channels)
        self.neurons = nn.ModuleList(f.norm_neuron(channels) for _ in in_channels)

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        lat = [conv(x) for conv, x in zip(self.lateral, feats)]
        merged = [lat[-1]]
        for cur in reversed(lat[:-1]):
            merged.insert(0, cur + _upsample_to(merged[0], cur.shape[-2:]))
        return [sn(conv(x)) for sn, conv, x in zip(self.neurons, self.output, merged)]


class Readout(nn.Module):
    """Turns ``[T, B, C, H, W]`` prediction currents into ``[B, C, H, W]`` outputs."""

    def __init__(self, channels: int, mode: str, neuron_cfg: Mapping[str, Any], backend: str) -> None:
        super().__init__()
        self.mode = mode
        if mode == "rate":
            cfg = dict(neuron_cfg)
            self.neuron = build_neuron(**cfg, backend=backend, channels=channels)
            self.weight = nn.Parameter(torch.full((channels, 1, 1), 4.0))
            self.bias = nn.Parameter(torch.full((channels, 1, 1), -2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "membrane":
            return x.mean(0)
        rate = self.neuron(x).mean(0)
        return rate * self.weight + self.bias


class FCOSHead(nn.Module):
    def __init__(self, channels: int, num_classes: int, num_convs: int, num_levels: int, readout: str,
                 f: LayerFactory) -> None:
        super().__init__()

        def tower() -> nn.Sequential:
            layers: list[nn.Module] = []
            for _ in range(num_convs):
                layers += [f.conv(channels, channels, 3, input_max=f.spike_max), f.norm_neuron(channels)]
            return nn.Sequential(*layers)

        # every convolution of the head reads spikes (the pyramid's, then the towers')
        self.cls_tower = tower()
        self.box_tower = tower()
        self.cls_logits = MultiStep(f.conv2d(channels, num_classes, 3, bias=True, input_max=f.spike_max))
        self.box_ltrb = MultiStep(f.conv2d(channels, 4, 3, bias=True, input_max=f.spike_max))
        self.centerness = MultiStep(f.conv2d(channels, 1, 3, bias=True, input_max=f.spike_max))
        self.cls_readout = Readout(num_classes, readout, f.neuron_cfg, f.backend)
        self.box_readout = Readout(4, readout, f.neuron_cfg, f.backend)
        self.ctr_readout = Readout(1, readout, f.neuron_cfg, f.backend)
        self.scales = nn.Parameter(torch.ones(num_levels))
        for conv in (self.cls_logits[0], self.box_ltrb[0], self.centerness[0]):
            nn.init.normal_(conv.weight, std=0.01)
            nn.init.zeros_(conv.bias)
        # a prior of 1% foreground keeps the focal loss stable at the start (FCOS, RetinaNet)
        nn.init.constant_(self.cls_logits[0].bias, -math.log((1 - 0.01) / 0.01))
        if readout == "rate":
            nn.init.constant_(self.cls_readout.bias, -math.log((1 - 0.01) / 0.01))

    def forward(self, feats: Sequence[torch.Tensor], strides: Sequence[int]):
        cls_out, box_out, ctr_out = [], [], []
        for level, (x, stride) in enumerate(zip(feats, strides)):
            c = self.cls_tower(x)
            b = self.box_tower(x)
            logits = self.cls_readout(self.cls_logits(c))  # [B, K, H, W]
            raw = self.box_readout(self.box_ltrb(b)) * self.scales[level]
            ltrb = torch.exp(raw.clamp(max=10.0)) * stride  # pixels, always positive
            ctr = self.ctr_readout(self.centerness(b))
            cls_out.append(logits.flatten(2).transpose(1, 2))  # [B, HW, K]
            box_out.append(ltrb.flatten(2).transpose(1, 2))  # [B, HW, 4]
            ctr_out.append(ctr.flatten(1))  # [B, HW]
        return torch.cat(cls_out, 1), torch.cat(box_out, 1), torch.cat(ctr_out, 1)


def default_scale_ranges(strides: Sequence[int]) -> list[tuple[float, float]]:
    """FCOS's ranges: level l takes objects whose largest ltrb distance is up to 8 x its stride."""
    ranges, lo = [], 0.0
    for i, s in enumerate(strides):
        hi = math.inf if i == len(strides) - 1 else 8.0 * s
        ranges.append((lo, hi))
        lo = hi
    return ranges


class SpikingFCOS(nn.Module):
    """Spiking anchor-free detector.

    Args:
        num_classes: object classes (1 for faces).
        in_channels, T, depth, variant, width, connect, stem, neuron, norm, zero_init_residual, backend:
            the SEW-ResNet backbone's settings (:class:`~snntrain.models.sew_resnet.SEWResNet`).
        spike_bytes: the backbone's, and the same for the pyramid's lateral convolutions and the head's, which
            read spikes.
        head: head settings: ``fpn_levels`` (backbone stages 1-4 to use, fine to coarse),
            ``fpn_channels``, ``num_convs`` per tower, ``readout`` (membrane or rate),
            ``scale_ranges`` (per level ``[lo, hi]``; None: FCOS's 8 x stride rule),
            ``center_sampling_radius`` (in strides), and decoding: ``score_thresh``,
            ``nms_thresh``, ``pre_nms_top_n``, ``max_detections``, ``flip_test``; multi-scale inference
            (see :meth:`detect`): ``object_sizes`` (``[lo, hi]``, the object sizes in pixels the detector was
            trained on; None: unknown, one pass), ``train_size`` (its training image side), ``test_scales``
            (``auto`` or a list of factors), ``scale_step``, ``min_object`` (the smallest object the auto
            pyramid looks for, a fraction of the image's shorter side; 0: down to the image's own pixels),
            ``merge`` (``nms`` or ``vote``, :data:`MERGES`), ``tile_size``.

    ``forward(images)`` returns a dict with ``cls_logits`` ``[B, L, K]``, ``box_ltrb``
    ``[B, L, 4]`` (pixels), ``centerness`` ``[B, L]`` (logits), and the ``points``
    ``[L, 2]`` (x, y pixel centres), ``strides`` ``[L]`` and scale ``ranges`` ``[L, 2]`` of
    the L locations.
    """

    def __init__(
        self,
        num_classes: int = 1,
        in_channels: int = 3,
        T: int = 4,
        depth: int | None = None,
        width: int = 16,
        connect: str = "ADD",
        stem: str = "imagenet",
        neuron: Mapping[str, Any] | None = None,
        norm: str = "batchnorm",
        zero_init_residual: bool = False,
        head: Mapping[str, Any] | None = None,
        backend: str = "auto",
        variant: str | None = None,
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        head = dict(head or {})
        levels = list(head.pop("fpn_levels", [2, 3, 4]))
        channels = int(head.pop("fpn_channels", 64))
        num_convs = int(head.pop("num_convs", 2))
        readout = head.pop("readout", "membrane")
        scale_ranges = head.pop("scale_ranges", None)
        self.center_sampling_radius = float(head.pop("center_sampling_radius", 1.5))
        self.score_thresh = float(head.pop("score_thresh", 0.05))
        self.nms_thresh = float(head.pop("nms_thresh", 0.5))
        self.pre_nms_top_n = int(head.pop("pre_nms_top_n", 1000))
        self.max_detections = int(head.pop("max_detections", 100))
        self.flip_test = flag("flip_test", head.pop("flip_test", False))
        object_sizes = head.pop("object_sizes", None)
        train_size = head.pop("train_size", None)
        self.test_scales = check_scales("test_scales", head.pop("test_scales", "auto"))
        self.scale_step = number("scale_step", head.pop("scale_step", 1.41))
        self.min_object = number("min_object", head.pop("min_object", 0.03))
        self.merge = one_of("merge", head.pop("merge", "vote"), MERGES)
        self.tile_size = positive_int("tile_size", head.pop("tile_size", 1024))
        if head:
            raise ValueError(f"unknown detector head setting(s) {sorted(head)}; valid: fpn_levels, fpn_channels, "
                             "num_convs, readout, scale_ranges, center_sampling_radius, score_thresh, nms_thresh, "
                             "pre_nms_top_n, max_detections, flip_test, object_sizes, train_size, test_scales, "
                             "scale_step, min_object, merge, tile_size")
        if object_sizes is not None:
            if (isinstance(object_sizes, (str, bytes)) or not isinstance(object_sizes, Sequence)
                    or len(object_sizes) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                     for v in object_sizes)
                    or not 0 < object_sizes[0] <= object_sizes[1]):
                raise ValueError(f"object_sizes={object_sizes!r} must be [lo, hi] with 0 < lo <= hi (pixels) or null")
            object_sizes = [float(v) for v in object_sizes]
        self.object_sizes = object_sizes
        self.train_size = None if train_size is None else positive_int("train_size", train_size)
        if not 0.0 <= self.min_object < 1.0:
            raise ValueError(f"min_object={self.min_object!r} must be in [0, 1): a fraction of the image's "
                             "shorter side")
        if self.scale_step <= 1.0:
            raise ValueError(f"scale_step={self.scale_step!r} must be larger than 1")
        if self.tile_size < 64:
            raise ValueError(f"tile_size={self.tile_size!r} must be at least 64 pixels")
        if not levels or any(lv not in (1, 2, 3, 4) for lv in levels) or sorted(set(levels)) != levels:
            raise ValueError(f"fpn_levels={levels!r} must be increasing backbone stages among 1, 2, 3, 4")
        one_of("readout", readout, READOUTS)
        self.num_classes = positive_int("num_classes", num_classes)
        self.backbone = SEWResNet(depth=depth, variant=variant, num_classes=0, in_channels=in_channels, T=T,
                                  connect=connect, stem=stem, width=width, neuron=neuron, norm=norm,
                                  zero_init_residual=zero_init_residual, backend=backend, spike_bytes=spike_bytes)
        self.levels = levels
        # stages above the pyramid's top level would never run: keep no parameters for them (DDP needs a
        # gradient for every parameter, and they would only cost memory)
        for i in range(levels[-1] + 1, 5):
            setattr(self.backbone, f"layer{i}", None)
        self.strides = [self.backbone.stage_strides[lv - 1] for lv in levels]
        if scale_ranges is None:
            ranges = default_scale_ranges(self.strides)
        else:
            ranges = [(float(lo), float(hi)) for lo, hi in scale_ranges]
            if len(ranges) != len(levels):
                raise ValueError(f"scale_ranges has {len(ranges)} entries; fpn_levels has {len(levels)}")
        self.scale_ranges = ranges
        f = LayerFactory(neuron, norm, backend, T=T, spike_bytes=spike_bytes)
        self.fpn = SpikingFPN([self.backbone.stage_channels[lv - 1] for lv in levels], channels, f,
                              [self.backbone.stage_max[lv - 1] for lv in levels])
        self.head = FCOSHead(channels, num_classes, num_convs, len(levels), readout, f)
        self._points_cache: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def locations(self, sizes: Sequence[tuple[int, int]], device: torch.device):
        """Pixel centres ``[L, 2]``, strides ``[L]`` and scale ranges ``[L, 2]`` of all levels (cached per size;
        not for the symbolic sizes of an export with dynamic height and width, nor inside ``torch.compile``,
        where they become part of the graph: a cached tensor made by a CUDA-graph replay would be the graph's
        output memory, overwritten by the next step)."""
        key = (tuple(sizes), str(device))
        uncached = any(not isinstance(v, int) for hw in sizes for v in hw) or torch.compiler.is_compiling()
        if uncached or key not in self._points_cache:
            # made on the device itself: a copy from host memory cannot be captured in a CUDA graph
            # (a compiled objective under ``cuda_graph`` builds these in every replay)
            pts, strides, ranges = [], [], []
            for (h, w), s, (lo, hi) in zip(sizes, self.strides, self.scale_ranges):
                ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=device),
                                        torch.arange(w, dtype=torch.float32, device=device), indexing="ij")
                p = torch.stack([xs.flatten(), ys.flatten()], 1) * s + s // 2
                pts.append(p)
                strides.append(torch.full((h * w,), float(s), device=device))
                ranges.append(torch.stack([torch.full((h * w,), float(lo), device=device),
                                           torch.full((h * w,), float(hi), device=device)], 1))
            found = (torch.cat(pts), torch.cat(strides), torch.cat(ranges))
            if uncached:
                return found
            self._points_cache[key] = found
        return self._points_cache[key]

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = self.backbone.forward_features(images, num_stages=self.levels[-1])
        feats = self.fpn([feats[lv - 1] for lv in self.levels])
        cls_logits, box_ltrb, centerness = self.head(feats, self.strides)
        points, strides, ranges = self.locations([tuple(f.shape[-2:]) for f in feats], images.device)
        return {"cls_logits": cls_logits, "box_ltrb": box_ltrb, "centerness": centerness, "points": points,
                "strides": strides, "ranges": ranges}

    # ------------------------------------------------------------------ training targets

    @torch.no_grad()
    def targets(self, outputs: Mapping[str, torch.Tensor], boxes: torch.Tensor, labels: torch.Tensor,
                num_boxes: torch.Tensor) -> dict[str, torch.Tensor]:
        """FCOS targets for padded ground truth; see :func:`fcos_targets`."""
        return fcos_targets(outputs["points"], outputs["strides"], outputs["ranges"], boxes, labels, num_boxes,
                            self.center_sampling_radius)

    # ------------------------------------------------------------------ inference

    def scale_plan(self, height: int, width: int, scales: str | Sequence[float] | None = None) -> list[float]:
        """The scales (finest first) :meth:`detect` runs an image of ``height`` x ``width`` at: ``scales`` (None:
        ``test_scales``), ``auto`` for :func:`pyramid_scales` (one pass at scale 1 when the detector does not
        know its training sizes), or a list of factors."""
        scales = check_scales("scales", self.test_scales if scales is None else scales)
        if scales != "auto":
            return list(scales)
        if self.object_sizes is None or self.train_size is None:
            return [1.0]
        finest = finest_scale(height, width, self.object_sizes[0], self.min_object)
        return pyramid_scales(height, width, self.train_size, self.scale_step, finest)

    def valid_range(self, index: int, num_scales: int) -> tuple[float, float]:
        """The sizes (square root of the area, pixels of the scaled image) of the boxes that scale ``index`` of
        ``num_scales`` (finest first) keeps: the trained sizes widened by :data:`VALID_RANGE_SLACK`, no lower
        limit at the finest scale and no upper one at the coarsest; any size for one scale or unknown sizes."""
        if self.object_sizes is None or num_scales == 1:
            return 0.0, math.inf
        lo = 0.0 if index == 0 else self.object_sizes[0] * VALID_RANGE_SLACK[0]
        hi = math.inf if index == num_scales - 1 else self.object_sizes[1] * VALID_RANGE_SLACK[1]
        return lo, hi

    @torch.no_grad()
    def detect(self, images: torch.Tensor, outputs: Mapping[str, torch.Tensor] | None = None,
               scales: str | Sequence[float] | None = None) -> list[dict[str, torch.Tensor]]:
        """Detections per image, boxes in the pixels of ``images`` (clipped to them).

        ``scales`` (None: the detector's ``test_scales``) picks the passes (:meth:`scale_plan`): a single
        pass at scale 1 decodes the network's outputs for ``images`` (``outputs``, when given, are those, and
        are decoded as they are even for images larger than a tile);
        several scales (an image pyramid), or an image larger than ``tile_size``, run :meth:`detect_scaled`
        at each scale, keep per scale the boxes of the sizes the detector was trained on
        (:meth:`valid_range`), map them back and merge them (``merge``: NMS at ``nms_thresh``, or
        :meth:`vote`), keeping the ``max_detections`` best per image.

        With ``flip_test`` (test-time augmentation) every pass also sees the images mirrored left to right;
        its outputs there, mapped back to the locations they mirror (left and right distances swapped), are
        averaged with the plain ones before decoding: class and quality logits and box distances alike.
        Images whose width is not a multiple of the coarsest stride are first padded on the right (mid
        grey, as batches are padded) so that the locations mirror onto each other."""
        height, width = (int(v) for v in images.shape[-2:])
        plan = self.scale_plan(height, width, scales)
        if plan == [1.0] and (outputs is not None or max(height, width) <= self.tile_size):
            return self._detect_pass(images, outputs)  # outputs given (validation): decoded as they are
        from torchvision.ops import batched_nms

        found: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(images.shape[0])]
        for i, scale in enumerate(plan):
            lo, hi = self.valid_range(i, len(plan))
            for per_image, det in zip(found, self.detect_scaled(images, scale)):
                size = _box_size(det["boxes"]) * scale
                keep = (size >= lo) & (size <= hi)
                per_image.append({**{k: v[keep] for k, v in det.items()},
                                  "scale": torch.full((int(keep.sum()),), i, device=size.device)})
        results = []
        for per_image in found:
            merged = {k: torch.cat([d[k] for d in per_image]) for k in ("boxes", "scores", "labels", "scale")}
            if self.merge == "vote":
                merged = self.vote(merged, plan)
            else:
                kept = batched_nms(merged["boxes"], merged["scores"], merged["labels"], self.nms_thresh)
                merged = {k: v[kept] for k, v in merged.items()}
            results.append({k: merged[k][: self.max_detections] for k in ("boxes", "scores", "labels")})
        return results

    def vote(self, dets: Mapping[str, torch.Tensor], plan: Sequence[float]) -> dict[str, torch.Tensor]:
        """Merge a pyramid's boxes (``scale``: the index in ``plan`` each came from) by voting: the best box
        left and every left box of its class overlapping it by more than ``nms_thresh`` form a cluster; its
        box is their score-weighted mean, its score the mean of the best scores of its :data:`VOTE_SCALES`
        best scales, over as many scales as should have seen a box of its size (:meth:`valid_range`; at least
        one, at most ``VOTE_SCALES``), so that an object must be confirmed at several scales where several
        see it."""
        from torchvision.ops import box_iou

        boxes, scores, labels, source = (dets[k] for k in ("boxes", "scores", "labels", "scale"))
        if len(boxes) == 0:
            return dict(dets)
        ranges = torch.tensor([self.valid_range(i, len(plan)) for i in range(len(plan))], device=boxes.device)
        factors = torch.tensor(list(plan), device=boxes.device)
        iou = box_iou(boxes, boxes)
        free = torch.ones(len(boxes), dtype=torch.bool, device=boxes.device)
        out_boxes, out_scores, out_labels = [], [], []
        for i in scores.argsort(descending=True).tolist():
            if not free[i]:
                continue
            members = free & (iou[i] > self.nms_thresh) & (labels == labels[i])
            free &= ~members
            w = scores[members]
            box = (boxes[members] * w[:, None]).sum(0) / w.sum()
            best = torch.zeros(len(plan), device=boxes.device).scatter_reduce(0, source[members], w, "amax")
            size = _box_size(box[None]) * factors
            expected = int(((size >= ranges[:, 0]) & (size <= ranges[:, 1])).sum())
            k = max(1, min(VOTE_SCALES, expected))
            out_boxes.append(box)
            out_scores.append(best.topk(k).values.sum() / k)
            out_labels.append(labels[i])
        order = torch.stack(out_scores).argsort(descending=True)
        return {"boxes": torch.stack(out_boxes)[order], "scores": torch.stack(out_scores)[order],
                "labels": torch.stack(out_labels)[order]}

    @torch.no_grad()
    def detect_scaled(self, images: torch.Tensor, scale: float) -> list[dict[str, torch.Tensor]]:
        """One level of the pyramid: ``images`` resized by ``scale`` (bilinear, antialiased when shrinking),
        detected in tiles of at most ``tile_size`` pixels a side when larger; boxes in the pixels of
        ``images``. Tiles overlap by more than the largest trained object (a quarter of a tile when the
        detector does not know its sizes) and each keeps the boxes whose centre lies in its own part of
        the overlap, so every object that fits the overlap is decoded whole in one tile."""
        height, width = (int(v) for v in images.shape[-2:])
        h, w = max(1, round(height * scale)), max(1, round(width * scale))
        x = images
        if (h, w) != (height, width):
            x = F.interpolate(images, size=(h, w), mode="bilinear", align_corners=False, antialias=scale < 1)
        tile = self.tile_size
        if self.object_sizes is None:
            overlap = tile // 4
        else:
            overlap = min(tile // 2, math.ceil(self.object_sizes[1] * VALID_RANGE_SLACK[1]) + 2 * max(self.strides))
        ys, xs = tile_starts(h, tile, overlap), tile_starts(w, tile, overlap)

        def bounds(starts: list[int]) -> list[tuple[float, float]]:  # each tile's own part: up to mid-overlap
            cuts = [(a + tile + b) / 2 for a, b in zip(starts[:-1], starts[1:])]
            return list(zip([-math.inf, *cuts], [*cuts, math.inf]))

        parts: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(images.shape[0])]
        for y0, (ylo, yhi) in zip(ys, bounds(ys)):
            for x0, (xlo, xhi) in zip(xs, bounds(xs)):
                crop = x[..., y0:y0 + tile, x0:x0 + tile]
                for per_image, det in zip(parts, self._detect_pass(crop)):
                    b = det["boxes"] + torch.tensor([x0, y0, x0, y0], dtype=det["boxes"].dtype,
                                                    device=det["boxes"].device)
                    cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
                    keep = (cx >= xlo) & (cx < xhi) & (cy >= ylo) & (cy < yhi)
                    per_image.append({"boxes": b[keep], "scores": det["scores"][keep], "labels": det["labels"][keep]})
        back = torch.tensor([w / width, h / height, w / width, h / height], device=images.device)
        limit = torch.tensor([width, height, width, height], dtype=torch.float32, device=images.device)
        results = []
        for per_image in parts:
            boxes = torch.cat([d["boxes"] for d in per_image]).float() / back
            results.append({"boxes": torch.minimum(boxes.clamp(min=0), limit),
                            "scores": torch.cat([d["scores"] for d in per_image]),
                            "labels": torch.cat([d["labels"] for d in per_image])})
        return results

    @torch.no_grad()
    def _detect_pass(self, images: torch.Tensor, outputs: Mapping[str, torch.Tensor] | None = None
                     ) -> list[dict[str, torch.Tensor]]:
        """One pass over ``images`` as given (with ``flip_test``, and its mirror image): :meth:`decode`."""
        if self.flip_test:
            pad = -images.shape[-1] % max(self.strides)
            padded = F.pad(images, (0, pad)) if pad else images
            if outputs is None or pad:
                outputs = self(padded)
            outputs = self.merge_flipped(outputs, self(padded.flip(-1)), padded.shape[-1])
        elif outputs is None:
            outputs = self(images)
        return self.decode(outputs, image_size=tuple(images.shape[-2:]))

    def mirror_index(self, width: int, outputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """For every location of ``outputs`` (images ``width`` pixels wide, a multiple of every stride),
        the index of the location that mirrors it left to right ``[L]``."""
        if any(width % s for s in self.strides):
            raise ValueError(f"mirrored locations need an image width that is a multiple of every stride "
                             f"{self.strides}; got width {width}")
        index, start = [], 0
        for stride in self.strides:  # the levels' locations, one block per level, row-major
            n, cols = int((outputs["strides"] == stride).sum()), width // stride
            grid = torch.arange(start, start + n, device=outputs["points"].device).view(n // cols, cols)
            index.append(grid.flip(1).flatten())  # column c <-> cols - 1 - c, same row
            start += n
        return torch.cat(index)

    def merge_flipped(self, outputs: Mapping[str, torch.Tensor], flipped: Mapping[str, torch.Tensor],
                      width: int) -> dict[str, torch.Tensor]:
        """``outputs`` averaged with ``flipped`` (the outputs for the mirrored images) mapped back."""
        mirror = self.mirror_index(width, outputs)
        ltrb = flipped["box_ltrb"][:, mirror][..., [2, 1, 0, 3]]  # left and right swap in the mirror
        merged = dict(outputs)
        merged["cls_logits"] = (outputs["cls_logits"] + flipped["cls_logits"][:, mirror]) / 2
        merged["centerness"] = (outputs["centerness"] + flipped["centerness"][:, mirror]) / 2
        merged["box_ltrb"] = (outputs["box_ltrb"] + ltrb) / 2
        return merged

    @torch.no_grad()
    def decode(self, outputs: Mapping[str, torch.Tensor], image_size: tuple[int, int] | None = None
               ) -> list[dict[str, torch.Tensor]]:
        """Boxes, scores and labels per image: score = sqrt(sigmoid(cls) * sigmoid(centerness)),
        ``score_thresh``, top ``pre_nms_top_n``, class-wise NMS (``nms_thresh``), top ``max_detections``.
        Boxes are clipped to ``image_size`` (h, w) when given."""
        from torchvision.ops import batched_nms

        cls = outputs["cls_logits"].float().sigmoid()
        ctr = outputs["centerness"].float().sigmoid()
        scores_all = torch.sqrt(cls * ctr.unsqueeze(-1))  # [B, L, K]
        points = outputs["points"]
        ltrb = outputs["box_ltrb"].float()
        boxes_all = torch.cat([points - ltrb[..., :2], points + ltrb[..., 2:]], -1)  # [B, L, 4]
        results = []
        num_classes = scores_all.shape[-1]
        for scores, boxes in zip(scores_all, boxes_all):
            flat = scores.flatten()
            keep = flat > self.score_thresh
            idx = keep.nonzero().squeeze(1)
            if idx.numel() > self.pre_nms_top_n:
                idx = idx[flat[idx].topk(self.pre_nms_top_n).indices]
            loc, cls_idx = idx // num_classes, idx % num_classes
            b, s = boxes[loc], flat[idx]
            if image_size is not None:
                h, w = image_size
                b = torch.stack([b[:, 0].clamp(0, w), b[:, 1].clamp(0, h), b[:, 2].clamp(0, w), b[:, 3].clamp(0, h)], 1)
            kept = batched_nms(b, s, cls_idx, self.nms_thresh)[: self.max_detections]
            results.append({"boxes": b[kept], "scores": s[kept], "labels": cls_idx[kept]})
        return results


def _box_size(boxes: torch.Tensor) -> torch.Tensor:
    """Square root of the area of xyxy boxes ``[n, 4]`` (0 for empty ones)."""
    return ((boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)).sqrt()


def fcos_targets(
    points: torch.Tensor,
    strides: torch.Tensor,
    ranges: torch.Tensor,
    boxes: torch.Tensor,
    labels: torch.Tensor,
    num_boxes: torch.Tensor,
    center_sampling_radius: float = 1.5,
    chunk_elements: int = 1 << 24,
) -> dict[str, torch.Tensor]:
    """Assign padded ground truth to locations, the FCOS way, without host synchronisation.

    Args:
        points: ``[L, 2]`` location centres (x, y) in pixels; strides ``[L]``; ranges ``[L, 2]``
            (each location's level takes boxes whose largest ltrb distance is in ``[lo, hi]``).
        boxes: ``[B, M, 4]`` xyxy ground truth padded to M; labels ``[B, M]``; num_boxes ``[B]``.
        center_sampling_radius: a location is positive only inside the box and within this many
            strides of the box centre (the region is clipped to the box).
        chunk_elements: boxes are tested in chunks of about this many ``[B, L, chunk]`` elements, so
            memory does not grow with B x L x M (the result does not depend on it).

    Returns a dict with ``labels`` ``[B, L]`` (class index, -1 for background), ``ltrb``
    ``[B, L, 4]`` (distances to the assigned box; zeros for background, so the GIoU loss
    treats them as padding), ``centerness`` ``[B, L]`` and ``positive`` ``[B, L]`` (bool).
    Among several candidate boxes, the one with the smallest area wins.
    """
    B, M = boxes.shape[:2]
    L = points.shape[0]
    if M == 0:
        zeros = points.new_zeros((B, L))
        return {"labels": torch.full((B, L), -1, dtype=torch.long, device=points.device),
                "ltrb": points.new_zeros((B, L, 4)), "centerness": zeros, "positive": zeros.bool()}
    x = points[None, :, None, 0]  # [1, L, 1]
    y = points[None, :, None, 1]
    radius = strides[None, :, None] * center_sampling_radius
    lo, hi = ranges[None, :, None, 0], ranges[None, :, None, 1]
    valid = torch.arange(M, device=boxes.device)[None, :] < num_boxes[:, None]  # [B, M]
    # The [B, L, chunk] candidate tests run over chunks of boxes with a running minimum, so memory stays
    # bounded for images with many faces (WIDER FACE has images with over a thousand at full resolution).
    chunk = max(1, min(M, int(chunk_elements) // max(1, B * L)))
    min_area = points.new_full((B, L), math.inf)
    best = torch.zeros((B, L), dtype=torch.long, device=points.device)
    for start in range(0, M, chunk):
        part = boxes[:, start:start + chunk]
        x1, y1, x2, y2 = (part[:, None, :, i] for i in range(4))  # [B, 1, C]
        left, top, right, bottom = x - x1, y - y1, x2 - x, y2 - y  # [B, L, C]
        inside_box = torch.minimum(torch.minimum(left, top), torch.minimum(right, bottom)) > 0
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        inside_center = (
            (x > torch.maximum(cx - radius, x1)) & (x < torch.minimum(cx + radius, x2))
            & (y > torch.maximum(cy - radius, y1)) & (y < torch.minimum(cy + radius, y2))
        )
        reach = torch.maximum(torch.maximum(left, top), torch.maximum(right, bottom))
        candidate = inside_box & inside_center & (reach >= lo) & (reach <= hi) & valid[:, None, start:start + chunk]
        area = ((x2 - x1) * (y2 - y1)).expand_as(candidate)
        area = torch.where(candidate, area, torch.full_like(area, math.inf))
        part_min, part_best = area.min(-1)  # ties between equal areas: the lowest box index
        better = part_min < min_area  # strictly: an earlier chunk keeps its ties
        min_area = torch.where(better, part_min, min_area)
        best = torch.where(better, part_best + start, best)
    positive = torch.isfinite(min_area)
    chosen = boxes.gather(1, best[..., None].expand(B, L, 4))  # [B, L, 4]
    px, py = points[None, :, 0], points[None, :, 1]
    target = torch.stack([px - chosen[..., 0], py - chosen[..., 1], chosen[..., 2] - px, chosen[..., 3] - py], -1)
    target = torch.where(positive[..., None], target, torch.zeros_like(target))
    lr, tb = target[..., 0::2], target[..., 1::2]
    ctr = torch.sqrt(
        (lr.amin(-1) / lr.amax(-1).clamp(min=1e-6)) * (tb.amin(-1) / tb.amax(-1).clamp(min=1e-6))
    )
    ctr = torch.where(positive, ctr, torch.zeros_like(ctr))
    cls = labels.gather(1, best).masked_fill(~positive, -1)
    return {"labels": cls, "ltrb": target, "centerness": ctr, "positive": positive}
