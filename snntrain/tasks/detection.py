"""Object (face) detection with the spiking FCOS detector.

Training: FCOS targets, sigmoid focal loss + GIoU (our Triton kernel, ``ltrb`` form) +
centerness BCE, each normalised by the number of positive locations; no host
synchronisation in the step. Validation: the same losses, decoding (score threshold,
NMS), mAP@0.5 and mAP@[.5:.95] with torchmetrics, and a few images with predicted
(red) and ground-truth (green) boxes drawn to TensorBoard.

WIDER FACE easy / medium / hard: when the validation set carries the official
difficulty lists (``eval_tools/ground_truth/wider_{easy,medium,hard}_val.mat``), each
level is scored with the official protocol (:mod:`snntrain.wider_eval`: global score
normalisation, 1000-threshold precision-recall curve, unlisted faces ignored, VOC AP)
on the original image pixels, the predictions mapped back from the network's input
frame (``val/wider_easy`` etc.). These are the numbers papers report; ``val/map_50`` is
COCO-style AP over the kept boxes and is not comparable with them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..losses import QUALITIES, fcos_loss
from ..models import is_detector, model_label
from ..validation import one_of
from .base import SpikingTask
from .metrics import WeightedMean

#: Losses logged per stage (``fcos_loss``'s outputs).
LOGGED_LOSSES = ("loss", "loss_cls", "loss_box", "loss_ctr", "num_pos")


def _map_backend() -> str:
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError:
        return "pycocotools"
    import logging

    logging.getLogger("faster_coco_eval").setLevel(logging.WARNING)  # not its summary table at every validation
    return "faster_coco_eval"


def draw_detections(image: torch.Tensor, pred: dict[str, torch.Tensor], gt: dict[str, torch.Tensor] | None = None,
                    min_score: float = 0.3, min_side: int = 256) -> torch.Tensor:
    """A normalised image ``[3, H, W]`` as float ``[0, 1]``, enlarged (nearest) to at least ``min_side``
    pixels, with ground truth (green) and predictions scoring at least ``min_score`` (red, with
    their scores) drawn on it."""
    import torch.nn.functional as F
    from torchvision.utils import draw_bounding_boxes

    from ..data.detection import denormalize_image

    img = denormalize_image(image.float().cpu())
    scale = max(1, -(-min_side // min(img.shape[-2:])))
    img = (F.interpolate(img[None], scale_factor=scale, mode="nearest")[0] * 255).round().to(torch.uint8)
    if gt is not None and len(gt["boxes"]):
        img = draw_bounding_boxes(img, gt["boxes"].float().cpu() * scale, colors="lime", width=2)
    keep = pred["scores"] >= min_score
    if keep.any():
        boxes, scores = pred["boxes"][keep].float().cpu() * scale, pred["scores"][keep].tolist()
        img = draw_bounding_boxes(img, boxes, labels=[f"{s:.2f}" for s in scores], colors="red", width=2)
    return img.float() / 255.0


def padded_to_list(targets: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Per-image ``boxes``/``labels`` from a padded batch (host side: for metrics only)."""
    out = []
    for boxes, labels, n in zip(targets["boxes"], targets["labels"], targets["num_boxes"].tolist()):
        out.append({"boxes": boxes[:n].float(), "labels": labels[:n].long()})
    return out


class DetectionTask(SpikingTask):
    """Trains ``config["model"]`` (a detector config: a ``head`` section) on detection batches
    ``(images [B, 3, S, S], {"boxes" [B, M, 4], "labels" [B, M], "num_boxes" [B], ...})``.

    Logs ``train/loss`` and its parts ``train/loss_cls``, ``train/loss_box``,
    ``train/loss_ctr``, and ``train/num_pos`` (positive locations per image), each for this
    process's batch (``_step``) and the epoch (``_epoch``); the epoch values under ``val/``;
    ``val/map_50``, ``val/map`` (0.5:0.95), ``val/mar_100``; and images under ``val/detections``
    (rank 0's first validation images). Epoch losses are sums over all positives divided by their
    number (each batch's loss weighted by its positives), reduced over all processes: with DDP they
    equal one process's value over the same data, whatever the batches.
    """

    def __init__(self, config: dict[str, Any], backend: str = "auto") -> None:
        super().__init__(config, backend)
        if not is_detector(config["model"]):
            raise ValueError(f"task=detect trains a detector: model=sew_fcos (task=detect's default), not "
                             f"{model_label(config['model'])}")
        from torchmetrics.detection import MeanAveragePrecision

        task = config["task"]
        self.loss_cfg = dict(task.get("loss", {}))
        one_of("task.loss.quality", self.loss_cfg.get("quality", "centerness"), QUALITIES)
        self.num_images_logged = int(task.get("num_images_logged", 4))
        # synchronised by gather_list_states (rank order, any number of images per process)
        self.val_map = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend=_map_backend(),
                                            sync_on_compute=False)
        # sums kept on the device: a training step never waits for the host (snntrain.tasks.metrics)
        self.train_means, self.val_means = WeightedMean(LOGGED_LOSSES), WeightedMean(LOGGED_LOSSES)
        self._shown: tuple[torch.Tensor, list, list] | None = None
        self._wider = None  # WiderFaceAP for the epoch, when the val set has the official difficulty lists

    def training_inputs(self, batch) -> tuple[torch.Tensor, ...]:
        images, targets = batch
        return images, targets["boxes"], targets["labels"], targets["num_boxes"]

    def objective(self, model, images, boxes, labels, num_boxes) -> dict[str, torch.Tensor]:
        """The network's outputs, FCOS targets assigned to its locations, :func:`fcos_loss` and the logged
        values (:meth:`_loss`), as one graph under ``compile``."""
        return self._loss(model, model(images), boxes, labels, num_boxes)

    def _loss(self, model, outputs, boxes, labels, num_boxes) -> dict[str, torch.Tensor]:
        """:func:`fcos_loss`'s terms, and under ``"logged"`` the values of :data:`LOGGED_LOSSES` with their
        weights (``[2, 5]``, detached) for the means: the losses per positive location (they are normalised by
        the batch's positives) and ``num_pos`` per image."""
        assigned = model.targets(outputs, boxes, labels, num_boxes)
        losses = fcos_loss(outputs, assigned, **self.loss_cfg, backend=self.backend)
        num_pos, batch_size = losses["num_pos"], boxes.shape[0]  # boxes: [B, max boxes, 4]
        values = [losses[name] for name in LOGGED_LOSSES[:-1]] + [num_pos / batch_size]
        weights = [num_pos] * (len(LOGGED_LOSSES) - 1) + [torch.full_like(num_pos, batch_size)]
        losses["logged"] = torch.stack([torch.stack(values), torch.stack(weights)]).detach()
        return losses

    def _log_losses(self, stage: str, logged: torch.Tensor) -> None:
        """Add a batch's values (``_loss(...)["logged"]``) to the stage's means; on the training steps the
        logger writes, log them as step values too."""
        values, weights = logged.unbind()
        if stage == "val":
            self.val_means.update(values, weights)
            return
        self.train_means.update(values, weights)
        if self.logs_this_step():
            self.log_step_values({f"train/{name}_step": value for name, value in zip(LOGGED_LOSSES, values.unbind())})

    def epoch_metrics(self):
        return {"train/{}_epoch": (self.train_means, False)}

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if self.partial_batch(batch):
            return None  # skipped: static shapes under compile
        losses = self.train_objective(batch)
        self._log_losses("train", losses["logged"])
        return losses["loss"]

    def _difficulty_records(self) -> list | None:
        """The val set's WIDER FACE records when they carry the official difficulty lists."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        records = getattr(getattr(dm, "val_set", None), "records", None)
        if records and getattr(records[0], "difficulty", None) is not None:
            return records
        return None

    def on_validation_epoch_start(self) -> None:
        records = self._difficulty_records()
        self._wider = None
        if records is not None:
            from ..wider_eval import WiderFaceAP

            levels = list(records[0].difficulty)
            self._wider = WiderFaceAP([r.boxes for r in records],
                                      {level: [r.difficulty[level] for r in records] for level in levels}
                                      ).to(self.device)

    def _update_wider(self, preds: list[dict[str, torch.Tensor]], targets: dict[str, torch.Tensor]) -> None:
        """Feed the official WIDER FACE metric: detections mapped back to each image's original pixels."""
        from ..data.detection import boxes_to_original

        boxes = [boxes_to_original(p["boxes"].float(), targets["scale"][i], targets["pad"][i],
                                   targets["orig_size"][i]) for i, p in enumerate(preds)]
        self._wider.update(targets["image_id"].tolist(), boxes, [p["scores"].float() for p in preds])

    def validation_step(self, batch, batch_idx: int) -> None:
        images, boxes, labels, num_boxes = self.training_inputs(batch)
        targets = batch[1]
        outputs = self(images)
        losses = self._loss(self.model, outputs, boxes, labels, num_boxes)
        self._log_losses("val", losses["logged"])
        preds = self.model.detect(images, outputs)
        gts = padded_to_list(targets)
        self.val_map.update(preds, gts)
        if self._wider is not None:
            self._update_wider(preds, targets)
        if batch_idx == 0 and self.num_images_logged > 0 and self.trainer.is_global_zero:
            n = self.num_images_logged
            self._shown = (images[:n].detach().cpu(), [{k: v.cpu() for k, v in p.items()} for p in preds[:n]],
                           [{k: v.cpu() for k, v in g.items()} for g in gts[:n]])

    def on_validation_epoch_end(self) -> None:
        from ..distributed import gather_list_states

        self.log_epoch("val/{}", self.val_means, prog_bar={"loss"})
        # every process scores every process's detections, in the data's order: the values are the same
        # on all of them, and sync_dist (a mean of equal values, batch_size 1) only tells Lightning so
        gather_list_states(self.val_map)
        result = self.val_map.compute()
        self.val_map.reset()
        for key in ("map", "map_50", "map_75", "mar_100"):
            self.log(f"val/{key}", result[key].float().clamp(min=0.0).to(self.device), prog_bar=key == "map_50",
                     sync_dist=True, batch_size=1)
        if self._wider is not None:
            for level, ap in self._wider.compute().items():
                self.log(f"val/wider_{level}", torch.as_tensor(ap, dtype=torch.float32, device=self.device),
                         sync_dist=True, batch_size=1)
            self._wider = None
        if self._shown is not None and not self.trainer.sanity_checking:
            self._log_images(*self._shown)
        self._shown = None

    def _log_images(self, images: torch.Tensor, preds: list, gts: list) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        tb = next((lg for lg in self.loggers if isinstance(lg, TensorBoardLogger)), None)
        if tb is None or not self.trainer.is_global_zero:
            return
        grid = torch.stack([draw_detections(img, p, g) for img, p, g in zip(images, preds, gts)])
        tb.experiment.add_images("val/detections", grid, self.global_step)

    def predict_step(self, batch, batch_idx: int):
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model.detect(images)
