"""Checkpoint export for deployment, and loaders that need neither Hydra nor Lightning.

An export folder holds:

``config.yaml``         the resolved run config (the model section rebuilds the network)
``model.safetensors``   the weights
``model_card.json``     task, classes, T, input shape, training backend, metrics, efficiency report, files
``README.md``           the same card for people
``model.onnx``          the network with the T loop unrolled (PyTorch backend), opset 18
``model.pt2``           a ``torch.export`` program (Triton ops when exported on a GPU)
``model.nir``           the NIR graph (neuromorphic hardware and other SNN libraries; see docs/nir.md):
                        a classifier, or a detector's backbone, with BatchNorm folded into the convolutions,
                        written for one reader (``nir_target``: spec, snntorch, norse or spikingjelly)

The ONNX graph and the .pt2 program take a normalised image batch ``[B, C, S, S]``; a detector's
also any height and width that are multiples of its coarsest stride (one pass at one scale: run an
image pyramid around it as README "Export and inference" shows). A classifier returns logits
``[B, K]``; a detector returns ``boxes`` ``[B, L, 4]`` (xyxy pixels of the input) and ``scores``
``[B, L, K]`` for all L locations, before thresholding and NMS (see
:meth:`snntrain.models.SpikingFCOS.decode`).

An export is written into a temporary folder and moved into the export folder when complete; the formats an
earlier export of the same weights left there stay, and the model card lists them all (see
:func:`export_checkpoint`, which refuses to replace a file unless told to).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .backend import backend_device, resolve_backend, trained_backend
from .checkpoint import CheckpointError, checkpoint_config, read_checkpoint
from .errors import UnavailableError
from .fileio import atomic_path
from .models import SpikingFCOS, build_model
from .nn.neurons import set_backend
from .version import __version__

log = logging.getLogger(__name__)

FORMATS = ("safetensors", "onnx", "torch_export", "nir")
#: The file each format writes into an export folder.
FORMAT_FILES = {"safetensors": "model.safetensors", "onnx": "model.onnx", "torch_export": "model.pt2", "nir": "model.nir"}
#: The files every export writes besides its formats' (the model card lists the formats in the folder).
EXPORT_FILES = ("config.yaml", "model_card.json", "README.md")
#: Model-card keys that describe one format; they stay in the card as long as the format's file does.
FORMAT_KEYS = {"onnx": ("onnx_max_abs_diff",), "torch_export": ("torch_export_backend", "torch_export_max_abs_diff"),
               "nir": ("nir_target", "nir_dt", "nir_max_abs_diff", "nir_unfolded_max_abs_diff")}
#: What an export writes unless told otherwise (NIR is opt-in: not every network has a NIR form).
DEFAULT_FORMATS = ("safetensors", "onnx", "torch_export")
ONNX_OPSET = 18


# ----------------------------------------------------------------------------- inference modules


class SpikingClassifier(nn.Module):
    """A trained classifier: ``forward(images)`` gives logits ``[B, K]``; ``classes`` names them."""

    def __init__(self, model: nn.Module, config: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.config = config
        self.classes = list(config.get("data", {}).get("classes") or range(config["model"]["num_classes"]))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    @torch.no_grad()
    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """Class probabilities ``[B, K]``."""
        return self.model(images).float().softmax(-1)


class SpikingDetector(nn.Module):
    """A trained detector: ``forward(images)`` gives one dict per image with ``boxes`` ``[n, 4]``
    (xyxy pixels of the input), ``scores`` ``[n]`` and ``labels`` ``[n]``, after NMS.

    ``images`` are normalised as in training (:func:`snntrain.data.detection.normalize_image`), at any size:
    ``scales`` (None: the model's ``test_scales``, ``auto``) runs a photo larger than the training square
    as an image pyramid (:meth:`snntrain.models.SpikingFCOS.detect`); ``[1.0]`` is a single pass."""

    def __init__(self, model: SpikingFCOS, config: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.config = config
        self.classes = list(config.get("data", {}).get("classes") or ["face"])

    def forward(self, images: torch.Tensor, scales: str | Sequence[float] | None = None
                ) -> list[dict[str, torch.Tensor]]:
        return self.model.detect(images, scales=scales)


class ExportGraph(nn.Module):
    """Tensor-only forward for ONNX and torch.export (no Python data structures, no NMS)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.detector = isinstance(model, SpikingFCOS)

    def forward(self, images: torch.Tensor):
        if not self.detector:
            return self.model(images)
        out = self.model(images)
        ltrb, points = out["box_ltrb"].float(), out["points"]
        boxes = torch.cat([points - ltrb[..., :2], points + ltrb[..., 2:]], -1)
        scores = torch.sqrt(out["cls_logits"].float().sigmoid() * out["centerness"].float().sigmoid().unsqueeze(-1))
        return boxes, scores


def _wrap(model: nn.Module, config: dict[str, Any]) -> nn.Module:
    wrapped = SpikingDetector(model, config) if isinstance(model, SpikingFCOS) else SpikingClassifier(model, config)
    return wrapped.eval()


def model_config(config: dict[str, Any]) -> dict[str, Any]:
    """The model section of a run config. A detector trained on ``data=faces`` before its head recorded the
    face sizes it was trained on (``object_sizes``, ``train_size``: multi-scale inference) takes them from
    the run's data section."""
    model = dict(config["model"])
    data = config.get("data", {})
    head = model.get("head")
    if head is not None and "object_sizes" not in head and data.get("name") == "faces":
        model["head"] = {**head, "object_sizes": list(data["face_size"]), "train_size": int(data["image_size"])}
    return model


def _model_from(config: dict[str, Any], state_dict: dict[str, torch.Tensor], backend: str, source: Path) -> nn.Module:
    model = build_model(model_config(config), backend=backend)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not match its model config: missing weights {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected weights {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}"
        )
    return model.eval()


def _checkpoint_model(ckpt: dict[str, Any], backend: str, source: Path) -> nn.Module:
    config = checkpoint_config(ckpt)
    state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    return _model_from(config, state, backend, source)


def load_checkpoint(ckpt_path: str | os.PathLike, backend: str = "auto", map_location: str | torch.device = "cpu"
                    ) -> nn.Module:
    """A ready classifier or detector (eval mode) from a Lightning checkpoint written by snntrain."""
    path = Path(ckpt_path)
    ckpt = read_checkpoint(path)
    wrapped = _wrap(_checkpoint_model(ckpt, resolve_backend(backend), path), checkpoint_config(ckpt))
    return wrapped.to(map_location)


def load_exported(path: str | os.PathLike, backend: str = "auto", map_location: str | torch.device = "cpu"
                  ) -> nn.Module:
    """A ready classifier or detector (eval mode) from an export folder (``config.yaml`` +
    ``model.safetensors``), without Hydra or Lightning."""
    import yaml
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(path)
    cfg_file, weights = folder / "config.yaml", folder / "model.safetensors"
    for f in (cfg_file, weights):
        if not f.is_file():
            raise CheckpointError(f"{folder} is not an snntrain export folder: {f.name} is missing "
                                  "(export with export.formats including safetensors)")
    config = yaml.safe_load(cfg_file.read_text())
    if not isinstance(config, dict) or "model" not in config:
        raise CheckpointError(f"{cfg_file} has no model section")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights} cannot be read ({err}): truncated or corrupt") from err
    wrapped = _wrap(_model_from(config, state, resolve_backend(backend), weights), config)
    return wrapped.to(map_location)


def program_ops(path: str | os.PathLike) -> list[str]:
    """The ``snntrain::`` operators an exported ``model.pt2`` calls (read from the archive's graph, without
    loading it): empty for a program exported with the PyTorch backend."""
    import re
    import zipfile

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            graphs = [n for n in archive.namelist() if n.endswith(".json") and "/models/" in f"/{n}"]
            text = b"".join(archive.read(n) for n in graphs)
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path} is not a torch.export program ({err}): truncated or not a .pt2 file") from err
    return sorted({m.decode() for m in re.findall(rb"torch\.ops\.snntrain\.([A-Za-z0-9_]+)", text)})


def load_program(path: str | os.PathLike):
    """``torch.export.load`` of an exported ``model.pt2`` with snntrain's custom ops registered.

    A program exported with ``backend=triton`` calls snntrain's Triton kernels, which run on a CUDA GPU
    only (or in Triton's CPU interpreter, ``TRITON_INTERPRET=1``): without one this fails up front with
    a message naming the operators and the way out, instead of failing inside the kernels.
    """
    from . import kernels
    from .backend import triton_interpret

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist: give the model.pt2 file of an export folder")
    ops = program_ops(path)
    unknown = sorted(set(ops) - set(kernels.registered_ops()))
    if unknown:
        raise CheckpointError(
            f"{path} calls torch.ops.snntrain.{{{', '.join(unknown)}}}, which this snntrain version "
            f"({__version__}) does not define; load it with the snntrain version that exported it, or export the "
            "checkpoint again with this one")
    if ops and not torch.cuda.is_available() and not triton_interpret():
        raise UnavailableError(
            f"{path} was exported with backend=triton: its graph calls snntrain's Triton kernels "
            f"({', '.join('snntrain::' + o for o in ops)}), which need a CUDA GPU, and none is present here. "
            "Export the checkpoint again with the PyTorch backend, which runs anywhere "
            "(python -m snntrain task=export backend=torch ckpt_path=<file.ckpt>), or load the export folder "
            "with snntrain.load_exported(folder) (safetensors + config, any device)")
    return torch.export.load(str(path))


# ----------------------------------------------------------------------------- export


def input_shape(config: dict[str, Any]) -> list[int]:
    """``[1, C, S, S]``: the image batch the model was trained on."""
    data = config.get("data", {})
    size = data.get("image_size") or 32
    return [1, int(config["model"]["in_channels"]), int(size), int(size)]


def training_data_summary(config: dict[str, Any]) -> str:
    """One sentence on what the model was trained on, from the run config's ``data`` section: the model
    card, the export README and ``task=predict`` state it, so nobody mistakes a synthetic-data model for
    one trained on photographs."""
    data = config.get("data", {})
    name = data.get("name")
    size = data.get("image_size")
    if name == "faces":
        lo, hi = data.get("face_size", ["?", "?"])
        return (f"synthetic faces (data=faces): scikit-image's 25x25 grey LFW face crops, skin-coloured or tinted, "
                f"resized to {lo}-{hi} px and composited (hair and shoulders, occluders, lighting, blur) on tiles, "
                f"textures and face-free photographs, {size}x{size} images; never trained on real photographs of "
                "people")
    if name == "widerface":
        side = data.get("eval_max_side")
        return (f"WIDER FACE train (data=widerface): random square crops resized to {size}x{size}; "
                f"evaluated at {'the original resolution' if side is None else f'a longer side of at most {side}'}")
    if name == "digits":
        return f"scikit-learn's 8x8 handwritten digits (data=digits), resized to {size}x{size}"
    if name == "cifar10":
        return f"CIFAR-10 (data=cifar10), {size}x{size}"
    if name == "image_folder":
        return f"an image folder (data=image_folder: {data.get('root')}), {size}x{size}"
    return f"data={name}"


def check_formats(formats: object) -> list[str]:
    if isinstance(formats, str):
        formats = [formats]
    if not isinstance(formats, Sequence) or not formats or any(f not in FORMATS for f in formats):
        raise ValueError(f"export.formats={formats!r} is not valid; give a list from {', '.join(FORMATS)}")
    return list(dict.fromkeys(formats))


def _efficiency(ckpt: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """The checkpoint's efficiency report (measured at its last validation, ``checkpoint["efficiency"]``) with the
    static metrics of the exported weights; the static metrics alone for a checkpoint without one."""
    from .efficiency import NotSpiking, check_spiking, static_metrics

    report = dict(ckpt.get("efficiency") or {})
    report["static"] = static_metrics(model)
    if "workload" not in report:
        try:
            check_spiking(model)
            report["note"] = ("this checkpoint holds no validation report: python -m snntrain task=report "
                              "ckpt_path=<it> measures one")
        except NotSpiking as err:
            report["note"] = f"no report: {err}"
    return report


def _card(config: dict[str, Any], ckpt: dict[str, Any], shape: list[int], source: Path, model: nn.Module
          ) -> dict[str, Any]:
    meta = ckpt.get("snntrain", {})
    task = config["task"]["name"]
    return {
        "snntrain_version": __version__,
        "task": task,
        "classes": list(config.get("data", {}).get("classes") or []),
        "training_data": training_data_summary(config),
        "T": config["model"].get("T", config.get("T")),
        "input_shape": shape,
        "input_normalisation": "as the training data module: see config.yaml's data section",
        "backend_in_training": trained_backend(ckpt),
        "metrics": meta.get("metrics", {}),
        "epoch": ckpt.get("epoch"),
        "global_step": ckpt.get("global_step"),
        "checkpoint": str(source),
        "outputs": ("logits [B, K]" if task != "detect"
                    else "boxes [B, L, 4] xyxy pixels, scores [B, L, K] (before threshold and NMS); one pass at "
                         "one scale (run the image pyramid of multi_scale around it)"),
        **({"multi_scale": multi_scale_card(model_config(config)["head"])} if task == "detect" else {}),
        "efficiency": _efficiency(ckpt, model),
        "files": {},
    }


def multi_scale_card(head: dict[str, Any]) -> dict[str, Any]:
    """What a detector's model card records for multi-scale inference (:meth:`SpikingFCOS.detect`): the
    object sizes it was trained on and how its image pyramid is chosen."""
    return {
        "object_sizes": head.get("object_sizes"),
        "train_size": head.get("train_size"),
        "test_scales": head.get("test_scales", "auto"),
        "scale_step": head.get("scale_step", 1.41),
        "min_object": head.get("min_object", 0.03),
        "merge": head.get("merge", "vote"),
        "tile_size": head.get("tile_size", 1024),
        "how": ("object_sizes: the sizes (px of the network input) of the faces in training. Pyramid (auto): the "
                "photo at scales from min(1, object_sizes[0] / (min_object x its shorter side)) down to train_size / "
                "its longer side, adjacent scales at most scale_step apart; per scale keep boxes sized within "
                "object_sizes (x0.75-1.25; the finest scale also smaller, the coarsest also larger ones), map them "
                "back (divide by the scale) and merge them (merge: nms, or vote: score-weighted mean boxes scored by "
                "the mean of their three best scales, over as many as should see them)"
                if head.get("object_sizes") else "one pass at the evaluation geometry (no object sizes recorded)"),
    }


def _readme(card: dict[str, Any]) -> str:
    lines = [f"# snntrain export: {card['task']}", ""]
    for key in ("task", "classes", "training_data", "T", "input_shape", "backend_in_training", "epoch", "global_step",
                "checkpoint", "outputs", "multi_scale", "formats"):
        if key in card:
            lines.append(f"- {key}: {card[key]}")
    if card["metrics"]:
        lines += ["", "## Metrics at the checkpoint", ""]
        lines += [f"- {k}: {v:.4f}" for k, v in sorted(card["metrics"].items())]
    lines += ["", *_efficiency_lines(card.get("efficiency") or {})]
    lines += ["## Files", ""] + [f"- {k}: {v}" for k, v in card["files"].items()]
    lines += ["", "Load with `snntrain.load_exported(folder)` (safetensors + config), "
              "`onnxruntime.InferenceSession('model.onnx')`, `snntrain.export.load_program('model.pt2')`, or "
              "`snntrain.load_nir('model.nir')` (any NIR reader: `nir.read`).", ""]
    return "\n".join(lines)


def _efficiency_lines(report: dict[str, Any]) -> list[str]:
    from .efficiency import markdown

    if "workload" in report:
        step = report.get("global_step")
        title = "Efficiency" + (f" (validation at step {step})" if step is not None else "")
        return markdown(report, title=title, layers=False).splitlines() + [""]
    static = report.get("static") or {}
    lines = ["## Efficiency", ""] + [f"- {k}: {v}" for k, v in static.items()]
    return lines + ([f"- {report['note']}"] if "note" in report else []) + [""]


def _max_diff(a, b) -> float:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return max(float((torch.as_tensor(x).float().cpu() - torch.as_tensor(y).float().cpu()).abs().max())
               for x, y in zip(a, b))


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a state dict's names, dtypes, shapes and bytes (in name order): the identity of an export's
    weights, the same for the model that is exported and for the ``model.safetensors`` written from it."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def _folder_weights_digest(folder: Path, card: dict[str, Any]) -> str | None:
    """The weights digest of an existing export folder: its card's, or (a card written before cards recorded one)
    that of its ``model.safetensors``; None when neither says."""
    if card.get("weights_sha256"):
        return card["weights_sha256"]
    weights = folder / FORMAT_FILES["safetensors"]
    if weights.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return weights_digest(load_file(str(weights)))
        except (SafetensorError, OSError):  # unreadable: the folder's weights are unknown
            return None
    return None


def _read_card(folder: Path) -> dict[str, Any] | None:
    path = folder / "model_card.json"
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) else None


def _plan_folder(out_dir: Path, formats: Sequence[str], digest: str, overwrite: bool
                 ) -> tuple[dict[str, Any] | None, list[Path]]:
    """What exporting ``formats`` of the weights ``digest`` into ``out_dir`` does to what is there: returns the
    folder's model card when its other formats stay (an export of the same weights), and the files of another
    export that ``overwrite`` replaces. Refuses (``ValueError`` naming the folder, the files and
    ``export.overwrite``) to replace a file without ``overwrite``, and to write into a folder that is neither
    empty nor an export folder (one with a model card: an export's files are moved in with the card last)."""
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return None, []
    where = f"export.dir={str(out_dir)!r}"
    rewritten = {FORMAT_FILES[f] for f in formats}
    card = _read_card(out_dir)
    if card is None:  # not an export folder (or one whose card is gone): whose files these are is unknown
        others = sorted(p.name for p in out_dir.iterdir())
        raise ValueError(f"{where} holds files that are not an snntrain export ({', '.join(others[:4])}"
                         f"{', ...' if len(others) > 4 else ''}; no model_card.json): export into a new or empty "
                         "folder")
    same = _folder_weights_digest(out_dir, card) == digest
    present = [FORMAT_FILES[f] for f in FORMATS if (out_dir / FORMAT_FILES[f]).exists()]
    if not same:
        if not overwrite:
            raise ValueError(f"{where} holds an export of other weights ({card.get('checkpoint', '?')}: "
                             f"{', '.join(present) or 'no model files'}); export.overwrite=true replaces that export, "
                             "or export into another folder")
        return None, [out_dir / name for name in present if name not in rewritten]
    existing = [FORMAT_FILES[f] for f in formats if (out_dir / FORMAT_FILES[f]).exists()]
    if existing and not overwrite:
        raise ValueError(f"{where} already holds {', '.join(existing)} of this checkpoint's weights; "
                         "export.overwrite=true writes it again (or leave its format out of export.formats)")
    return card, []


def _kept_formats(card: dict[str, Any], folder: Path, formats: Sequence[str]) -> dict[str, Any]:
    """The entries of an earlier card (of the same weights) for the formats that stay in ``folder``: their file
    descriptions and their per-format keys."""
    kept: dict[str, Any] = {"files": {}}
    for fmt, name in FORMAT_FILES.items():
        if fmt in formats or not (folder / name).exists():
            continue
        kept["files"][name] = card.get("files", {}).get(name, fmt)
        kept.update({k: card[k] for k in FORMAT_KEYS.get(fmt, ()) if k in card})
    return kept


def export_checkpoint(
    ckpt_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    formats: Sequence[str] = DEFAULT_FORMATS,
    backend: str = "auto",
    opset: int = ONNX_OPSET,
    seed: int = 0,
    nir_dt: float | None = None,
    nir_target: str = "spec",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export a checkpoint's ``formats`` into the folder ``out_dir``; returns the model card.

    Each format writes its own file (:data:`FORMAT_FILES`) beside ``config.yaml`` and the model card
    (``model_card.json``, ``README.md``), which lists every format in the folder. An existing export folder
    of the same weights keeps its other formats (the README's commands export into one folder, format by
    format); a file that is already there is written again only with ``overwrite``, and a folder holding
    an export of other weights is replaced (its model files removed) only with ``overwrite``. Everything is
    written into a temporary folder first and moved into ``out_dir`` when complete, so a failed export
    changes nothing.

    ``backend`` is used for the torch.export program (``auto``: Triton on a GPU, PyTorch
    otherwise); ONNX and NIR always go through the PyTorch backend. ``nir_target`` is the
    reader the NIR graph is written for (:data:`snntrain.nir.NIR_TARGETS`); ``nir_dt`` its
    seconds per time step (None: the target's). A graph that the target cannot read is refused
    (naming every node and why) before anything is written.
    """
    from .nir import check_target
    from .validation import flag

    formats = check_formats(formats)
    check_target(nir_target)
    overwrite = flag("export.overwrite", overwrite)
    source = Path(ckpt_path)
    ckpt = read_checkpoint(source)
    config = checkpoint_config(ckpt)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"export.dir={str(out_dir)!r} exists and is not a folder")
    model = _checkpoint_model(ckpt, "torch", source)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    digest = weights_digest(state)
    earlier, replaced = _plan_folder(out_dir, formats, digest, overwrite)
    shape = input_shape(config)
    # a batch of 2 for tracing: a traced size of 1 would be specialised and not stay dynamic
    sample = torch.randn([2, *shape[1:]], generator=torch.Generator().manual_seed(seed))
    card = _card(config, ckpt, shape, source, model)
    card["weights_sha256"] = digest
    nir_graph = None
    if "nir" in formats:  # checked first: a model the target cannot read stops the export before any writing
        from .nir import to_nir

        nir_graph = to_nir(set_backend(model, "torch"), tuple(shape[1:]), nir_dt, nir_target)
    with torch.no_grad():
        reference = ExportGraph(model)(sample)
    written: dict[str, str] = {}
    with atomic_path(out_dir, is_dir=True) as tmp:
        import yaml

        if "safetensors" in formats:
            from safetensors.torch import save_file

            save_file(state, str(tmp / "model.safetensors"), metadata={"snntrain_version": __version__})
            written["model.safetensors"] = f"{len(state)} tensors"
        if "onnx" in formats:
            card["onnx_max_abs_diff"] = _export_onnx(model, sample, reference, tmp / "model.onnx", opset)
            written["model.onnx"] = (f"opset {opset}, T={card['T']} unrolled, PyTorch backend"
                                     + (", any height and width (multiples of the coarsest stride)"
                                        if isinstance(model, SpikingFCOS) else ""))
        if "torch_export" in formats:
            prog_backend = resolve_backend(backend)
            card["torch_export_backend"], card["torch_export_max_abs_diff"] = _export_program(
                model, prog_backend, sample, tmp / "model.pt2")
            where = ("batch 1 (fixed), needs a CUDA GPU (snntrain's Triton kernels; export with backend=torch "
                     "for any device)" if prog_backend == "triton" else
                     "any batch, height and width (multiples of the coarsest stride), any device"
                     if isinstance(model, SpikingFCOS) else "any batch, any device")
            written["model.pt2"] = f"torch.export program, {card['torch_export_backend']} backend, {where}"
        if nir_graph is not None:
            card.update(_export_nir(model, sample, nir_graph, tmp / "model.nir"))
            what = "backbone stage spikes" if isinstance(model, SpikingFCOS) else "per-step logits (mean over T)"
            written["model.nir"] = (f"NIR graph for {card['nir_target']}, BatchNorm folded, "
                                    f"dt={card['nir_dt']:g} s, {what}")
        kept = _kept_formats(earlier, out_dir, formats) if earlier is not None else {"files": {}}
        card.update({k: v for k, v in kept.items() if k != "files"})
        files = {"config.yaml": "resolved run config", **kept["files"], **written}
        card["files"] = {name: files[name] for name in ("config.yaml", *FORMAT_FILES.values()) if name in files}
        card["formats"] = [f for f in FORMATS if FORMAT_FILES[f] in card["files"]]
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / "model_card.json").write_text(json.dumps(card, indent=2))
        (tmp / "README.md").write_text(_readme(card))
    for path in replaced:  # files of the export that overwrite replaced, not written again
        path.unlink(missing_ok=True)
        log.info("snntrain: export: removed %s (an export of other weights; export.overwrite=true)", path)
    for fmt, name in FORMAT_FILES.items():
        if name in written:
            log.info("snntrain: export: %s written (%s: %s)", out_dir / name, fmt, written[name])
    for name in kept["files"]:
        log.info("snntrain: export: %s kept from an earlier export of these weights", out_dir / name)
    return card


def dynamic_dims(model: nn.Module) -> dict[int, Any]:
    """The input dimensions an exported graph keeps dynamic: the batch, and for a detector the height and
    width too, as multiples of its coarsest stride (so that one graph runs every scale of a pyramid)."""
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1)}
    if isinstance(model, SpikingFCOS):
        stride = max(model.strides)
        dims[2] = stride * torch.export.Dim("height_blocks", min=1, max=65536 // stride)
        dims[3] = stride * torch.export.Dim("width_blocks", min=1, max=65536 // stride)
    return dims


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """The ``loggers`` (and their children) pass warnings and errors only, for the duration."""
    targets = [logging.getLogger(name) for name in loggers]
    levels = [t.level for t in targets]
    for t, level in zip(targets, levels):
        t.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        for t, level in zip(targets, levels):
            t.setLevel(level)


def _export_onnx(model: nn.Module, sample: torch.Tensor, reference, path: Path, opset: int) -> float:
    import onnxruntime as ort

    graph = ExportGraph(set_backend(model, "torch")).eval()
    detector = graph.detector
    names = ["boxes", "scores"] if detector else ["logits"]
    with _quiet("onnx_ir", "onnxscript"):  # their graph passes log a line per initializer, rule and node at INFO
        torch.onnx.export(graph, (sample,), str(path), dynamo=True, opset_version=opset, input_names=["images"],
                          output_names=names, dynamic_shapes={"images": dynamic_dims(model)},
                          external_data=False, verbose=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"images": sample.numpy()})
    diff = _max_diff(tuple(got) if detector else got[0], reference)
    print(f"ONNX (onnxruntime) vs PyTorch backend: largest absolute difference {diff:.3g}", flush=True)
    return diff


def _export_nir(model: nn.Module, sample: torch.Tensor, graph, path: Path) -> dict[str, Any]:
    """Write the NIR graph, read it back with the NIR package, run it with snntrain layers and compare with the
    model on the PyTorch backend with BatchNorm folded into the convolutions (the network the graph describes:
    the same spikes, logits to float32 rounding), and with the model itself (folding changes the rounding of
    every convolution, so a membrane within rounding of the threshold can fire in one and not in the other)."""
    from .nir import NIR_TARGETS, NIRNetwork, fold_batchnorm, load_nir, save_nir

    target = NIR_TARGETS[graph.metadata["target"]]
    save_nir(graph, path)
    net = load_nir(path, backend="torch")
    x = sample.unsqueeze(0).expand(net.T, *sample.shape)  # [T, B, C, H, W]: the same input at every step

    def run(m: nn.Module) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            if isinstance(m, NIRNetwork):
                out = m(x)
                return tuple(out[f"stage{i}"] for i in range(1, len(out) + 1)) if isinstance(out, dict) else (out,)
            return tuple(m.backbone.forward_features(x)) if isinstance(m, SpikingFCOS) else (m(x),)

    got = run(net)
    diffs = {name: _max_diff(got, run(m)) for name, m in (("folded", fold_batchnorm(model)), ("model", model))}
    print(f"NIR graph for {target.name} (read back, snntrain layers): largest absolute difference "
          f"{diffs['folded']:.3g} from the model with BatchNorm folded, {diffs['model']:.3g} from the model",
          flush=True)
    if target.name != "spec":
        print(f"NIR graph: import it with {target.reader}", flush=True)
    return {"nir_target": target.name, "nir_dt": float(graph.metadata["dt"]), "nir_max_abs_diff": diffs["folded"],
            "nir_unfolded_max_abs_diff": diffs["model"]}


def _export_program(model: nn.Module, backend: str, sample: torch.Tensor, path: Path):
    """Export, save, reload and run the program; compare it with the PyTorch backend on the same device
    (so that only the spiking layers' implementation differs, not the device's convolutions)."""
    device = backend_device(backend)
    net = ExportGraph(model).to(device).eval()
    if backend == "triton":
        # Triton kernels' launch grids would put range guards on a symbolic batch that
        # torch.export cannot keep: the program takes the batch size it was exported with.
        x = sample[:1].to(device)
        dynamic = None
    else:
        x = sample.to(device)
        dynamic = (dynamic_dims(model),)
    with torch.no_grad():
        reference = net(x)  # the model is on the PyTorch backend here
    set_backend(model, backend)
    try:
        program = torch.export.export(net, (x,), dynamic_shapes=dynamic)
        torch.export.save(program, str(path))
        with torch.no_grad():
            got = load_program(path).module()(x)
    finally:
        set_backend(model, "torch").cpu()
    diff = _max_diff(got, reference)
    print(f"torch.export program ({backend} backend) vs PyTorch backend on {device}: largest absolute difference "
          f"{diff:.3g}", flush=True)
    return backend, diff
