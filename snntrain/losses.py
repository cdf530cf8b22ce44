"""Detection losses: generalized-IoU box loss (:func:`giou_loss`, :class:`GIoULoss`) and the
FCOS detector's loss (:func:`fcos_loss`).

Semantics (both backends):

* Pairs are element-wise: box ``i`` of ``pred`` with box ``i`` of ``target``, both
  ``[..., 4]``. ``box_format="xyxy"``: corners ``(x1, y1, x2, y2)``.
  ``box_format="ltrb"``: distances ``(l, t, r, b)`` of the box sides from one common
  point (the anchor point of an anchor-free head), i.e. ``x1 = -l, y1 = -t, x2 = r,
  y2 = b`` relative to it; pred and target must share the point.
* Per-pair loss ``1 - GIoU``, computed as ``torchvision.ops.generalized_box_iou_loss``
  does, with the same ``eps`` placement: ``1 - (I / (U + eps) - (C - U) / (C + eps))``
  where the intersection ``I`` counts only where its width and height are both > 0.
* Padding: a target whose index-3 value (``y2``, or ``b`` for ltrb) is ``<= 0`` is
  padding. It contributes 0 to every reduction, gets 0 gradient, and is not counted.
* ``weight`` (optional, broadcastable to ``pred.shape[:-1]``) multiplies each box's loss.
* ``reduction``: ``"none"`` gives the per-box ``weight * loss`` (0 on padding) with shape
  ``pred.shape[:-1]``; ``"sum"`` the sum over boxes; ``"mean"`` the sum divided by the
  number of valid (non-padding) boxes, at least 1: ``sum(weight * loss) / max(#valid, 1)``
  (the weights do not enter the denominator). Empty input gives an empty tensor for
  ``none`` and 0 for ``sum`` and ``mean``.
* Dtypes: fp16, bf16 and fp32 boxes are read as they are, the math runs in fp32 and the
  loss is fp32; float64 boxes give an fp64 loss. Gradients have each input's dtype.
  ``pred`` and ``target`` may have different floating dtypes.
* Gradients flow to ``pred``, to ``target`` when it requires grad, and to ``weight`` when
  it requires grad. Where a min or max of two coordinates ties (identical or aligned
  boxes), the gradient is split in half between the two, as PyTorch's autograd of
  ``torch.maximum`` / ``torch.minimum`` does in torchvision's loss.
* Degenerate boxes (zero area, touching, identical, padding) give finite values.
  Inverted boxes (x2 < x1) are computed with the same formula as torchvision (signed
  areas); like there, a denominator ``U + eps`` or ``C + eps`` of exactly 0 is possible only
  for inverted boxes whose signed areas cancel to ``-eps``.

Backends (``backend``, see :mod:`snntrain.backend`): ``"triton"`` runs the kernels of
:mod:`snntrain.kernels.giou` (CUDA tensors, or any tensor with ``TRITON_INTERPRET=1``);
``"torch"`` runs :func:`giou_loss_reference`; ``"auto"`` picks Triton for CUDA tensors
in fp16 / bf16 / fp32 and the reference otherwise (CPU tensors, and float64, which is a
precision path, not a speed path). Nothing synchronises with the host on either backend.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .backend import check_backend, triton_importable, use_triton

REDUCTIONS = ("none", "sum", "mean")
BOX_FORMATS = ("xyxy", "ltrb")
_FLOAT_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _check_reduction(reduction: object) -> str:
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not valid; choose one of {', '.join(map(repr, REDUCTIONS))}")
    return reduction


def _check_box_format(box_format: object) -> str:
    if not isinstance(box_format, str) or box_format not in BOX_FORMATS:
        raise ValueError(f"box_format={box_format!r} is not valid; choose one of {', '.join(map(repr, BOX_FORMATS))}")
    return box_format


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps={eps!r} is not valid; it must be a finite number >= 0")
    return float(eps)


def _check_boxes(pred: object, target: object, weight: object) -> torch.Tensor | None:
    """Validate the tensors; return ``weight`` expanded to ``pred.shape[:-1]`` (a view), or None."""
    if not isinstance(pred, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise TypeError(f"pred and target must be tensors; got {type(pred).__name__} and {type(target).__name__}")
    shape = pred.shape
    if not shape or shape[-1] != 4:
        raise ValueError(f"pred must have shape [..., 4] (4 box coordinates in the last dimension); "
                         f"got shape {tuple(shape)}")
    if target.shape != shape:
        raise ValueError(f"target must have the same shape as pred {tuple(shape)}; got {tuple(target.shape)}")
    if pred.dtype not in _FLOAT_DTYPES or target.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"pred and target must be float16, bfloat16, float32 or float64; "
                        f"got {pred.dtype} and {target.dtype}")
    # Device: compare indices and CUDA-ness first (no torch.device objects on the common path).
    if (target.is_cuda is not pred.is_cuda or target.get_device() != pred.get_device()
            or (not pred.is_cuda and target.device != pred.device)):
        raise ValueError(f"pred and target must be on the same device; got {pred.device} and {target.device}")
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a tensor or None; got {type(weight).__name__}")
    if weight.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"weight must be a floating tensor; got {weight.dtype}")
    if weight.device != pred.device:
        raise ValueError(f"weight must be on pred's device {pred.device}; got {weight.device}")
    lead = shape[:-1]
    if weight.shape != lead:
        try:
            ok = torch.broadcast_shapes(weight.shape, lead) == lead
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"weight must have shape {tuple(lead)} (pred.shape[:-1], one weight per box) or "
                             f"broadcast to it; got {tuple(weight.shape)}")
        weight = weight.expand(lead)
    return weight


#: Validated option sets of eager calls: (reduction, box_format, backend, type(eps), eps) -> (eps as float, ltrb).
_OPTIONS: dict[tuple, tuple[float, bool]] = {}
_OPTIONS_MAX = 64


def _validate_options(reduction: object, box_format: object, eps: object, backend: object) -> tuple[float, bool]:
    _check_reduction(reduction)
    fmt = _check_box_format(box_format)
    eps = _check_eps(eps)
    check_backend(backend)
    return eps, fmt == "ltrb"


def _check_options(reduction: object, box_format: object, eps: object, backend: object) -> tuple[float, bool]:
    """Validate the non-tensor arguments (cached in eager mode: a training loop passes the same ones every call).

    While torch.compile traces, the checks run on the constants without the cache: a dict
    lookup keyed on ``type(eps)`` cannot be traced by every torch version (the key holds a
    type object), and reading or filling a global dict would only add guards and side
    effects to the compiled graph, where the checks cost nothing at run time anyway.
    """
    if torch.compiler.is_compiling():
        return _validate_options(reduction, box_format, eps, backend)
    try:
        key = (reduction, box_format, backend, eps.__class__, eps)  # the type: True == 1 == 1.0 as keys
        hit = _OPTIONS.get(key)
    except TypeError:  # unhashable argument: validation below raises
        key, hit = None, None
    if hit is not None:
        return hit
    out = _validate_options(reduction, box_format, eps, backend)
    if key is not None and len(_OPTIONS) < _OPTIONS_MAX:
        _OPTIONS[key] = out
    return out


def giou_loss_reference(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                        reduction: str = "mean", eps: float = 1e-7, *, box_format: str = "xyxy") -> torch.Tensor:
    """Pure-PyTorch GIoU loss with the semantics of :func:`giou_loss` (autograd gives the gradient).

    Arguments are not validated here (:func:`giou_loss` does that). Padding rows are
    replaced by a unit box before the arithmetic, so they cannot produce non-finite
    values or gradients.
    """
    acc = torch.float64 if torch.float64 in (pred.dtype, target.dtype) else torch.float32
    valid = target[..., 3] > 0
    unit = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=acc, device=pred.device)
    p = torch.where(valid.unsqueeze(-1), pred.to(acc), unit)
    t = torch.where(valid.unsqueeze(-1), target.to(acc), unit)
    x1, y1, x2, y2 = p.unbind(-1)
    gx1, gy1, gx2, gy2 = t.unbind(-1)
    if box_format == "ltrb":
        x1, y1, gx1, gy1 = -x1, -y1, -gx1, -gy1
    iw = torch.minimum(x2, gx2) - torch.maximum(x1, gx1)
    ih = torch.minimum(y2, gy2) - torch.maximum(y1, gy1)
    inter = torch.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    union = (x2 - x1) * (y2 - y1) + (gx2 - gx1) * (gy2 - gy1) - inter
    encl = (torch.maximum(x2, gx2) - torch.minimum(x1, gx1)) * (torch.maximum(y2, gy2) - torch.minimum(y1, gy1))
    loss = 1 - (inter / (union + eps) - (encl - union) / (encl + eps))
    if weight is not None:
        loss = loss * weight.to(acc)
    loss = torch.where(valid, loss, 0.0)
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / valid.sum().clamp(min=1).to(acc)


_kernels = None


def _giou_kernels():
    global _kernels
    if _kernels is None:
        from .kernels import giou as _k

        _kernels = _k
    return _kernels


def giou_loss(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, reduction: str = "mean",
              eps: float = 1e-7, *, box_format: str = "xyxy", backend: str = "auto") -> torch.Tensor:
    """Generalized-IoU loss of element-wise box pairs (see the module docstring for the semantics).

    Args:
        pred: predicted boxes ``[..., 4]`` (fp16, bf16, fp32 or fp64).
        target: target boxes, same shape; rows with index-3 value ``<= 0`` are padding.
        weight: optional per-box weights, broadcastable to ``pred.shape[:-1]``.
        reduction: ``"none"``, ``"sum"`` or ``"mean"`` (over valid boxes).
        eps: the stabiliser added to the union and enclosing areas.
        box_format: ``"xyxy"`` or ``"ltrb"``.
        backend: ``"auto"``, ``"torch"`` or ``"triton"``.

    Returns:
        fp32 (fp64 for fp64 boxes): shape ``pred.shape[:-1]`` for ``none``, a scalar otherwise.
    """
    weight = _check_boxes(pred, target, weight)
    eps, ltrb = _check_options(reduction, box_format, eps, backend)
    if backend == "auto":
        triton_path = pred.is_cuda and pred.dtype is not torch.float64 and target.dtype is not torch.float64 \
            and triton_importable()
    else:
        triton_path = use_triton(backend, pred)
    if triton_path:
        return _giou_kernels().giou_loss_op(pred, target, weight, reduction, eps, ltrb)
    return giou_loss_reference(pred, target, weight, reduction, eps, box_format=box_format)


class GIoULoss(nn.Module):
    """Module form of :func:`giou_loss`: ``GIoULoss(reduction, eps, box_format, backend)(pred, target, weight)``."""

    def __init__(self, reduction: str = "mean", eps: float = 1e-7, *, box_format: str = "xyxy",
                 backend: str = "auto") -> None:
        super().__init__()
        self.reduction = _check_reduction(reduction)
        self.eps = _check_eps(eps)
        self.box_format = _check_box_format(box_format)
        self.backend = check_backend(backend)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return giou_loss(pred, target, weight, self.reduction, self.eps, box_format=self.box_format,
                         backend=self.backend)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, eps={self.eps}, box_format={self.box_format!r}, backend={self.backend!r}"


#: What the detector's quality branch learns (:func:`fcos_loss`'s ``quality``).
QUALITIES = ("centerness", "iou")


def ltrb_iou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """IoU of element-wise ``[..., 4]`` ``ltrb`` box pairs that share their anchor point (0 where
    either box is empty)."""
    pred, target = pred.clamp(min=0), target.clamp(min=0)
    lo = torch.minimum(pred, target)
    inter = (lo[..., 0] + lo[..., 2]) * (lo[..., 1] + lo[..., 3])
    area_p = (pred[..., 0] + pred[..., 2]) * (pred[..., 1] + pred[..., 3])
    area_t = (target[..., 0] + target[..., 2]) * (target[..., 1] + target[..., 3])
    union = area_p + area_t - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(union))


def fcos_loss(
    outputs: dict[str, torch.Tensor],
    targets: dict[str, torch.Tensor],
    focal_alpha: float = 0.25,
    focal_gamma: float = 2.0,
    box_weight: float = 1.0,
    ctr_weight: float = 1.0,
    quality: str = "centerness",
    backend: str = "auto",
) -> dict[str, torch.Tensor]:
    """The FCOS detector's loss, all on the device.

    ``outputs``: ``cls_logits`` ``[B, L, K]``, ``box_ltrb`` ``[B, L, 4]``, ``centerness``
    ``[B, L]`` (logits); ``targets`` from :func:`snntrain.models.detector.fcos_targets`
    (``labels``, ``ltrb`` with zeros off the positives, ``centerness``, ``positive``).

    Sigmoid focal loss over all locations and classes, GIoU loss (``ltrb`` form: the
    background rows are padding) and a BCE of the quality branch (``centerness``) over the
    positive locations, each divided by the number of positives (at least 1). Returns ``loss``
    (the weighted sum), ``loss_cls``, ``loss_box``, ``loss_ctr`` and ``num_pos``.

    ``quality`` is what the quality branch learns, which decoding multiplies into the score:
    ``"centerness"`` (FCOS: the location's centerness) or ``"iou"`` (IoU-aware: the IoU of the
    location's predicted box with its ground truth, without gradient to the box, so that a box
    that will be drawn more precisely ranks higher, which is what AP at high IoU thresholds rewards).
    """
    if quality not in QUALITIES:
        raise ValueError(f"quality={quality!r} is not valid; choose one of {', '.join(map(repr, QUALITIES))}")
    from torchvision.ops import sigmoid_focal_loss

    positive = targets["positive"]
    num_pos = positive.sum().clamp(min=1).to(torch.float32)
    logits = outputs["cls_logits"].float()
    cls_target = torch.nn.functional.one_hot(targets["labels"].clamp(min=0), logits.shape[-1]).to(logits.dtype)
    cls_target = cls_target * positive.unsqueeze(-1)
    loss_cls = sigmoid_focal_loss(logits, cls_target, alpha=focal_alpha, gamma=focal_gamma, reduction="sum") / num_pos
    loss_box = giou_loss(outputs["box_ltrb"], targets["ltrb"], reduction="sum", box_format="ltrb",
                         backend=backend) / num_pos
    if quality == "iou":
        ctr_target = torch.where(positive, ltrb_iou(outputs["box_ltrb"].detach().float(), targets["ltrb"]),
                                 torch.zeros_like(targets["centerness"]))
    else:
        ctr_target = targets["centerness"]
    ctr_bce = torch.nn.functional.binary_cross_entropy_with_logits(
        outputs["centerness"].float(), ctr_target, reduction="none")
    loss_ctr = (ctr_bce * positive).sum() / num_pos
    loss = loss_cls + box_weight * loss_box + ctr_weight * loss_ctr
    return {"loss": loss, "loss_cls": loss_cls.detach(), "loss_box": loss_box.detach(),
            "loss_ctr": loss_ctr.detach(), "num_pos": num_pos}
