"""Training steps of whole spiking networks on the GPU, against SpikingJelly, with a GPU-time breakdown.

Cases (``--cases``), each a full step (forward, loss, backward, optimizer step) on the
same weights and batch:

* ``sew18-224``: SEW-ResNet-18 (ImageNet stem, width 64, ADD, LIF tau 2, sigmoid
  surrogate, no detach), T = 4, 224x224, batch 32, 10 classes, SGD (momentum 0.9);
* ``sew18-224-alif``: the same with ALIF neurons (an adaptive threshold, a second state; generated from its step
  function), against ``sew18-224``'s LIF;
* ``sew18-224-bytes``: ``sew18-224`` with ``model.spike_bytes=true``: the convolutions keep their spike inputs for
  the backward as uint8 instead of in the step's dtype (compare the peak memory and time with ``sew18-224``'s);
* ``sew18-224-fp8``, ``sew18-cifar-fp8``, ``event-fp8``: those cases with ``model.spike_fp8=true`` (the
  convolutions of spikes run their training forward in FP8, :mod:`snntrain.kernels.spike_conv`; their inputs kept
  in bits as with ``-bytes``);
* ``sew18-224-addafter``: ``sew18-224`` with each block's ``ADD`` run as PyTorch's addition after the block's last
  norm-neuron instead of in its kernel (:func:`snntrain.nn.norm_neuron_add` held off by a no-op forward hook);
* ``sew18-32``: the same network at 32x32, batch 128;
* ``sew18-cifar``: the CIFAR stem (3x3 conv, no max-pool) at 32x32, batch 128;
* ``event``: the same network (2 input channels, 11 classes) on event-like input that changes at every
  step, ``[T, B, 2, H, W]`` with T = 16, 128x128, batch 16 (the stem runs T times);
* ``detector``: the default ``task=detect`` model on a ``faces`` batch, FCOS loss, AdamW;
* the model zoo at ImageNet size (224x224, batch 32, T = 4, 10 classes, SGD), each against SpikingJelly's
  constructor of the same name (equal parameter counts): ``spiking_vgg11_bn-224``, ``spiking_resnet18-224`` (both
  LIF tau 2, sigmoid surrogate, no detach, on both sides) and ``ms_resnet18-224`` (each library's MS-ResNet neuron:
  SpikingJelly's rectangular surrogate, our triangular one of the same support);
* ``spiking_resnet18-224-addafter``: ``spiking_resnet18-224`` with each block's last batch norm, shortcut addition
  and neuron run as three modules (:func:`snntrain.nn.norm_add_neuron` held off by a no-op forward hook), not as the
  fused batch-norm neuron;
* the spiking transformers (:data:`TRANSFORMER_CASES`), SpikingJelly's variant of the same name on both sides:
  ``spikformer-cifar10`` (``spikformer_cifar10``, 32x32, batch 64), ``spikformer-s-224`` (``spikformer_s``, 224,
  batch 32), ``sdt-8-384`` (``sdt_8_384``, 224, batch 32), ``qkformer-10-384`` (``qkformer_10_384``, 224, batch 32);
  T = 4, 10 classes, SGD. Their ``relu-*`` rows are the floor of these networks: the same network with ReLU
  instead of every neuron, at T = 1 on T x B images; ``snntrain-*-recompute`` rows train with activation
  recomputation (``model.checkpoint=true``).

Providers: ``snntrain-eager`` (channels-last, the default on CUDA), ``snntrain-eager-unfused`` (the
same without the fused norm-neuron op: ``NormNeuron.fused = False``), ``snntrain-eager-nchw`` and
``snntrain-eager-nchw-unfused`` (contiguous NCHW maps),
``snntrain-compile`` and ``snntrain-reduce-overhead`` (``torch.compile`` of the model; the
second captures forward and backward in CUDA graphs), ``snntrain-graph`` and ``snntrain-compile-graph`` (the
whole step, optimizer included, captured in one CUDA graph over the eager or the compiled model: what
``cuda_graph=true`` runs), ``snntrain-torch`` (the PyTorch
reference backend), and SpikingJelly 2.0.0's ``sew_resnet18`` in a child process per
implementation (``SJ_LIF_CUDA_IMPLEMENTATION=triton``; bf16 through its precision API,
``prepare_model_for_precision(..., PrecisionConfig(neuron_storage="bf16"))``). Every
provider uses a fused optimizer. Precision: fp32, or bf16 autocast.

The floor: ``resnet18-eager``, ``resnet18-reduce-overhead`` and ``resnet18-graph``, torchvision's ResNet-18 (the same
convolutions and norms, ReLU instead of spiking neurons, channels-last) at batch T x B, the batch our
convolutions see; for the model-zoo cases ``relu-eager``, ``relu-reduce-overhead`` and ``relu-graph``: the case's own
network with every neuron replaced by a ReLU (a norm-neuron by the norm and a ReLU, :func:`relu_twin`), T = 1, at
batch T x B (the SEW cases run it too, beside the ResNet-18). The run users launch: ``cli-eager`` and ``cli-reduce-overhead`` run ``python -m
snntrain`` (``cli-graph``: ``cuda_graph=true``; ``cli-compile-graph``: with ``compile=default``) on the same
network, batch, optimizer and precision (``data=synthetic``, ``frames=T`` for the
event case; the detector its default ``task=detect`` run) and report its ``perf/train_images_per_s``
(the last epoch's steps after 5 warm-up steps, Lightning's loop, data transfer, metrics, logging and
callbacks included); ms/step there is batch / rate. ``--cli-pythonpath DIR`` runs another checkout's
command line (the ``cli-*@DIR`` rows), to compare versions in one run. ``lightning-loop``: Lightning's training
loop alone on a one-parameter model, the host's floor under any command-line step.

Per row: ms/step (steps run back to back after warm-up, between two synchronisations), images/s, peak
memory (``max_memory_allocated`` over the timed steps), compile time (first calls) and,
with ``--profile``, the GPU time per step split by kind: convolution, norm, neuron,
pooling, layout (NCHW<->NHWC transposes), elementwise (everything else, inductor's fused
kernels too), optimizer, and idle/host (the step's wall time not covered by kernels).

Each row's ``vs_floor`` is its ms per step over the floor's (the ResNet-18's where it ran, else the ReLU twin's) in
the same mode (eager, ``reduce-overhead``, the
whole-step graph), where that row was run too. Host speed drifts (by 15-25 % between runs of one provider on the
GPU machines); with ``--rounds N`` the in-process providers of a case (``snntrain-*``, ``resnet18-*``) are built
together and timed in N rounds that take turns, each row then the median over the rounds, with their range, and
``vs_floor`` the median of the rounds' ratios: a comparison that a drift does not decide.

    python scripts/bench_train.py --out DIR [--cases sew18-224 sew18-32 ...] [--providers ...]
        [--precisions fp32 bf16] [--steps 20] [--rounds 1] [--profile]

Writes ``bench_train.csv``, ``bench_train.jsonl`` (one line per row, appended as each case
finishes, so a run cut short keeps what it measured; the schema of ``scripts/bench_utils.write_rows``) and
``bench_train.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_utils as bu  # noqa: E402

CASES = {
    "sew18-224": {"size": 224, "batch": 32, "stem": "imagenet"},
    # the same step with ALIF (LIF with an adaptive threshold: a second state), generated from its step function
    "sew18-224-alif": {"size": 224, "batch": 32, "stem": "imagenet", "neuron": "ALIF"},
    # the same step with the convolutions' spike inputs kept for the backward in the step's dtype, not as uint8
    "sew18-224-bytes": {"size": 224, "batch": 32, "stem": "imagenet", "spike_bytes": True},
    # the same step with each block's ADD an addition after its last norm-neuron, not folded into its kernel
    "sew18-224-addafter": {"size": 224, "batch": 32, "stem": "imagenet", "add_after": True},
    # SEW's AND and IAND connections (folded into the last norm-neuron of each block), and unfolded ("-after")
    "sew18-224-and": {"size": 224, "batch": 32, "stem": "imagenet", "connect": "AND"},
    "sew18-224-and-after": {"size": 224, "batch": 32, "stem": "imagenet", "connect": "AND", "add_after": True},
    "sew18-224-iand": {"size": 224, "batch": 32, "stem": "imagenet", "connect": "IAND"},
    "sew18-32": {"size": 32, "batch": 128, "stem": "imagenet"},
    "sew18-cifar": {"size": 32, "batch": 128, "stem": "cifar"},
    "event": {"size": 128, "batch": 16, "stem": "imagenet", "T": 16, "in_channels": 2, "classes": 11, "temporal": True},
    "detector": {"batch": 16},
    # the model zoo: a family and variant of snntrain.models, and SpikingJelly's constructor of the same name
    "spiking_vgg11_bn-224": {"size": 224, "batch": 32, "model": {"name": "spiking_vgg", "variant": "spiking_vgg11_bn"}},
    "spiking_resnet18-224": {"size": 224, "batch": 32,
                             "model": {"name": "spiking_resnet", "variant": "spiking_resnet18"}},
    "ms_resnet18-224": {"size": 224, "batch": 32, "model": {"name": "ms_resnet", "variant": "ms_resnet18"}},
    # the same Spiking ResNet with each block's last norm, shortcut addition and neuron as three modules, not fused
    "spiking_resnet18-224-addafter": {"size": 224, "batch": 32, "add_after": True,
                                      "model": {"name": "spiking_resnet", "variant": "spiking_resnet18"}},
}
T, CLASSES = 4, 10

#: The spiking transformers' cases: model name and SpikingJelly 2.0's variant (the constructor of the same name builds
#: its side), image size and batch.
TRANSFORMER_CASES = {
    "spikformer-cifar10": {"model": {"name": "spikformer", "variant": "spikformer_cifar10"}, "size": 32, "batch": 64},
    "spikformer-s-224": {"model": {"name": "spikformer", "variant": "spikformer_s"}, "size": 224, "batch": 32},
    "sdt-8-384": {"model": {"name": "spike_driven_transformer", "variant": "sdt_8_384"}, "size": 224, "batch": 32},
    "qkformer-10-384": {"model": {"name": "qkformer", "variant": "qkformer_10_384"}, "size": 224, "batch": 32},
}
# the same steps with the convolutions of spikes' training forward in FP8 (their inputs kept in bits, as -bytes)
CASES.update({f"{case}-fp8": {**CASES[case], "spike_bytes": True, "spike_fp8": True}
              for case in ("sew18-224", "sew18-cifar", "event")})
CASES.update(TRANSFORMER_CASES)
NAME = "bench_train"


def case_T(case: str) -> int:
    return CASES[case].get("T", T)


def case_input(case: str, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of a case: images ``[B, C, S, S]`` (or ``[T, B, C, S, S]`` for temporal input) and labels."""
    c = CASES[case]
    shape = (c["batch"], c.get("in_channels", 3), c["size"], c["size"])
    if c.get("temporal"):
        shape = (case_T(case), *shape)
    x = torch.randn(shape, device="cuda", generator=generator)
    y = torch.randint(0, c.get("classes", CLASSES), (c["batch"],), device="cuda", generator=generator)
    return x, y
NEURON = {"type": "LIF", "tau": 2.0, "detach_reset": False, "surrogate": "sigmoid"}
PROVIDERS = ("snntrain-eager", "snntrain-eager-unfused", "snntrain-eager-nchw", "snntrain-eager-nchw-unfused",
             "snntrain-compile", "snntrain-reduce-overhead", "snntrain-graph", "snntrain-compile-graph",
             "snntrain-torch", "cli-eager", "cli-reduce-overhead", "cli-graph", "cli-compile-graph",
             "resnet18-eager", "resnet18-reduce-overhead", "resnet18-graph", "relu-eager", "relu-reduce-overhead",
             "relu-graph", "spikingjelly", "spikingjelly-compile", "lightning-loop")
#: In-process providers (built together and timed in rounds with ``--rounds``).
OWN = ("snntrain-", "resnet18-", "relu-")
#: Providers of the transformer cases only: the eager step and the whole-step graph with activation recomputation.
TRANSFORMER_PROVIDERS = ("snntrain-eager-recompute", "snntrain-graph-recompute")
PROVIDERS += TRANSFORMER_PROVIDERS
#: ``*-graph`` providers: the whole step (forward, loss, backward, optimizer) captured in one CUDA graph
#: (``snntrain.tasks.step_graph``, ``cuda_graph=true`` on the command line); ``*-compile-graph`` over the
#: ``compile=default`` objective.
KINDS = ("convolution", "norm", "neuron", "pooling", "layout", "elementwise", "optimizer", "idle/host")


def autocast(precision: str):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")


def kind_of(name: str) -> str:
    n = name.lower()
    if "neuron" in n or "multistep_lif" in n or "lif_" in n:
        return "neuron"
    if "nchwtonhwc" in n or "nhwctonchw" in n or "transpose" in n or "permute" in n:
        return "layout"
    if any(k in n for k in ("batch_norm", "batchnorm", "bn_", "welford", "layer_norm", "native_batch")):
        return "norm"
    if any(k in n for k in ("conv", "cudnn", "xmma", "implicit", "gemm", "wgrad", "dgrad", "fprop", "cutlass",
                            "sm80_", "sm90_", "winograd")):
        return "convolution"
    if any(k in n for k in ("batch_norm", "batchnorm", "bn_", "welford", "layer_norm", "native_batch")):
        return "norm"
    if "pool" in n:
        return "pooling"
    if any(k in n for k in ("multi_tensor", "fused_sgd", "sgd", "adam", "foreach")):
        return "optimizer"
    return "elementwise"


def time_steps(step, steps: int, warmup: int) -> tuple[float, float, float]:
    """(seconds of the warm-up calls, compilation included; ms per step over ``steps`` steps run
    back to back between two synchronisations, as in a training loop; peak bytes allocated over the warm-up and
    the steps: a whole-step graph allocates its activations in its private pool while it is captured, in the
    warm-up, and holds them from then on, so the peak of the timed steps alone would leave them out)."""
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return first, (time.perf_counter() - t) / steps * 1e3, torch.cuda.max_memory_allocated()


def breakdown(step, ms_per_step: float, steps: int = 5, label: str = "") -> dict[str, float]:
    """GPU milliseconds per step by kind, and idle/host = the unprofiled step time not covered
    by kernels (the profiler slows the host down, so its own wall time is not used). Prints the
    step's 15 longest kernels (GPU ms per step, kind), headed by ``label``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = dict.fromkeys(KINDS, 0.0)
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        if getattr(evt, "is_user_annotation", False) or evt.key.startswith(("snntrain::", "ProfilerStep")):
            continue  # a range around kernels counted by their own names (record_function ranges)
        gpu_us = getattr(evt, "self_device_time_total", None)
        if gpu_us is None:
            gpu_us = getattr(evt, "self_cuda_time_total", 0.0)
        if gpu_us and evt.device_type == torch.autograd.DeviceType.CUDA:
            out[kind_of(evt.key)] += gpu_us / 1e3 / steps
            kernels[evt.key] = kernels.get(evt.key, 0.0) + gpu_us / 1e3 / steps
    print(f"longest kernels, {label}: GPU ms per step, kind")
    for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {ms:7.3f}  {kind_of(name):11s} {name[:110]}")
    out["idle/host"] = max(0.0, ms_per_step - sum(out.values()))
    return out


class Bench(NamedTuple):
    """One in-process provider of a case, built and ready: ``step()`` runs one training step."""

    case: str
    provider: str
    precision: str
    batch: int
    step: Callable[[], None]
    note: str = ""


def measure(b: Bench, args) -> dict:
    """The row of ``b`` timed alone: ``--warmup`` calls, then ``--steps`` steps back to back."""
    first, ms, peak = time_steps(b.step, args.steps, args.warmup)
    prof = breakdown(b.step, ms, label=f"{b.case} {b.precision} {b.provider}") if args.profile else None
    return row(b.case, b.provider, b.precision, b.batch, first, ms, peak, prof, b.note)


def interleaved(benches: list[Callable[[], Bench | None]], args) -> list[dict]:
    """Rows of in-process providers timed in ``--rounds`` rounds, each round every provider's ``--steps`` steps in
    turn, so that a host which slows down or speeds up for a while does so for all of them alike. A row's
    ``ms_per_step`` is the median over the rounds (``ms_min``/``ms_max`` their range; ``vs_floor`` a median over the
    rounds too, see :func:`floor_ratios`). Every provider is built and warmed up before the first round and stays
    on the GPU; its peak memory is the larger of its peak over building and warming it up (a whole-step graph
    allocates its activations while it is captured) and its own resident memory (what building and warming it up
    left allocated) plus the largest rise over what was allocated when its steps began, both above what the
    providers built before it hold."""
    built = []
    peaks: dict[str, int] = {}
    for make in benches:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base, t0 = torch.cuda.memory_allocated(), time.perf_counter()
        b = make()
        if b is None:
            continue
        for _ in range(args.warmup):
            b.step()
        torch.cuda.synchronize()
        built.append((b, time.perf_counter() - t0, torch.cuda.memory_allocated() - base))
        peaks[b.provider] = torch.cuda.max_memory_allocated() - base
    times: dict[str, list[float]] = {b.provider: [] for b, _, _ in built}
    for _ in range(args.rounds):
        for b, _, resident in built:
            torch.cuda.synchronize()
            start = torch.cuda.memory_allocated()
            _, ms, peak = time_steps(b.step, args.steps, 0)
            times[b.provider].append(ms)
            peaks[b.provider] = max(peaks[b.provider], resident + peak - start)
    rows = []
    for b, first, _ in built:
        ms = times[b.provider]
        prof = (breakdown(b.step, statistics.median(ms), label=f"{b.case} {b.precision} {b.provider}")
                if args.profile else None)
        r = row(b.case, b.provider, b.precision, b.batch, first, statistics.median(ms), peaks[b.provider], prof,
                b.note)
        r.update(rounds=len(ms), ms_min=round(min(ms), 3), ms_max=round(max(ms), 3), ms_rounds=ms)
        rows.append(r)
    return rows


def floor_of(provider: str) -> tuple[str, ...]:
    """The floor rows a provider's row is set against, the first that ran: the ResNet-18's, else the ReLU twin's, of
    the same mode (eager, ``reduce-overhead`` or the whole-step graph); none for the floors themselves and for modes
    they are not run in."""
    if provider.startswith(("resnet18", "relu", "lightning")):
        return ()
    if provider.endswith("-graph"):
        mode = "graph"
    elif "reduce-overhead" in provider:
        mode = "reduce-overhead"
    elif "eager" in provider or provider in ("snntrain-torch", "spikingjelly"):
        mode = "eager"
    else:
        return ()
    return f"resnet18-{mode}", f"relu-{mode}"


def floor_ratios(rows: list[dict]) -> None:
    """Sets each row's ``vs_floor``: its ms per step over that of its floor row (:func:`floor_of`) of the same
    case and precision; where both were timed in rounds, the median of the per-round ratios."""
    for r in rows:
        f = next((o for name in floor_of(r["provider"]) for o in rows if o["provider"] == name
                  and o["case"] == r["case"] and o["precision"] == r["precision"]), None)
        if f is None:
            r["vs_floor"] = ""
        elif len(r.get("ms_rounds", ())) > 1 and len(r["ms_rounds"]) == len(f.get("ms_rounds", ())):
            r["vs_floor"] = round(statistics.median(a / b for a, b in zip(r["ms_rounds"], f["ms_rounds"])), 3)
        else:
            r["vs_floor"] = round(r["ms_per_step"] / f["ms_per_step"], 3)


def row(case, provider, precision, batch, first, ms, peak, prof=None, note=""):
    r = {"case": case, "provider": provider, "precision": precision, "batch": batch, "T": case_T(case),
         "ms_per_step": round(ms, 3), "images_per_s": round(batch / ms * 1e3, 1), "vs_floor": "",
         "rounds": 1, "ms_min": round(ms, 3), "ms_max": round(ms, 3),
         "peak_mem_mib": round(peak / 2**20, 1), "first_calls_s": round(first, 2), "note": note,
         "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
    for k in KINDS:
        r[f"ms_{k}"] = round(prof[k], 3) if prof else ""
    return r


# ----------------------------------------------------------------------------- snntrain


def sew_model(case: str, backend: str):
    from snntrain.models import SEWResNet

    c = CASES[case]
    torch.manual_seed(0)
    model = SEWResNet(depth=18, num_classes=c.get("classes", CLASSES), in_channels=c.get("in_channels", 3),
                      T=case_T(case), stem=c["stem"], width=64, neuron=case_neuron(case), backend=backend,
                      spike_bytes=c.get("spike_bytes", False), connect=c.get("connect", "ADD"))
    if c.get("spike_fp8"):
        from snntrain.nn import set_spike_fp8

        set_spike_fp8(model)
    if c.get("add_after"):  # a watched norm-neuron runs, and its block connects the shortcut after it
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            for block in layer:
                block.sn2.register_forward_hook(lambda *args: None)
    return model


def case_neuron(case: str) -> dict:
    """The benchmark's neuron settings for ``case``: LIF, or the case's neuron type with the same settings."""
    return {**NEURON, "type": CASES[case].get("neuron", NEURON["type"])}


def zoo_model(case: str, backend: str, T: int | None = None):
    """The model-zoo network of ``case`` (``snntrain.models.build_model``), with the benchmark's neuron (the
    family's own for MS-ResNet), seeded; ``T`` overrides the case's."""
    from snntrain.models import build_model

    c = CASES[case]
    spec = c["model"]
    torch.manual_seed(0)
    neuron = {} if spec["name"] == "ms_resnet" else {"neuron": NEURON}
    model = build_model({**spec, "num_classes": c.get("classes", CLASSES), "in_channels": c.get("in_channels", 3),
                         "T": case_T(case) if T is None else T, **neuron}, backend=backend)
    if c.get("add_after"):  # a watched neuron: its block runs the norm, the addition and the neuron one by one
        for block in model.modules():
            last = getattr(block, "sn3", None) if hasattr(block, "bn3") else getattr(block, "sn2", None)
            if last is not None and (hasattr(block, "bn2") or hasattr(block, "bn3")):
                last.register_forward_hook(lambda *args: None)
    return model


class _ReLU(torch.nn.Module):
    """A neuron's place in :func:`relu_twin`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class _NormReLU(torch.nn.Module):
    """A norm-neuron's place in :func:`relu_twin`: its norm over the folded batch, then ReLU."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor, steps: int | None = None) -> torch.Tensor:
        if steps is not None:  # a static [B, C, H, W] current over ``steps`` steps
            return torch.relu(self.norm(x)).unsqueeze(0).expand(steps, *x.shape)
        return torch.relu(self.norm(x.flatten(0, 1))).unflatten(0, x.shape[:2])


def plain_convolutions(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every convolution of spikes (``SpikeConv2d``, which keeps its input as uint8) replaced by a
    ``Conv2d`` with the same parameters, in place: the convolutions of a network without neurons read real values."""
    from snntrain.nn.layers import SpikeConv2d

    for name, m in list(model.named_modules()):
        if isinstance(m, SpikeConv2d):
            conv = torch.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation,
                                   m.groups, m.bias is not None, m.padding_mode, device="meta")
            conv.weight, conv.bias = m.weight, m.bias
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, conv)
    return model


def relu_twin(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every spiking neuron replaced by a ReLU, every norm-neuron by its norm and a ReLU, every
    max-pool of spikes by PyTorch's max-pool and every convolution of spikes by a plain one, in place: the same
    network, not spiking (the floor; run it with T = 1 on a batch of T x B images)."""
    from snntrain.nn import BaseNeuron, NormNeuron, SpikeMaxPool2d

    plain_convolutions(model)
    replaced: list[str] = []
    for name, m in list(model.named_modules()):
        if any(name.startswith(r + ".") for r in replaced):
            continue  # inside a norm-neuron that was replaced
        if isinstance(m, NormNeuron):
            twin = _NormReLU(m.norm)
        elif isinstance(m, BaseNeuron):
            twin = _ReLU()
        elif isinstance(m, SpikeMaxPool2d):
            twin = torch.nn.MaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, ceil_mode=m.ceil_mode)
        else:
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, twin)
        replaced.append(name)
    return model


def unfuse(model, provider: str) -> None:
    """``*-unfused`` providers: each norm and neuron through its own kernels (no fused norm-neuron op)."""
    from snntrain.nn import NormNeuron

    for m in model.modules():
        if isinstance(m, NormNeuron):
            m.fused = not provider.endswith("-unfused")


def ours(case: str, provider: str, precision: str) -> Bench:
    from snntrain.nn import set_backend
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    backend = "torch" if provider == "snntrain-torch" else "triton"
    mode = {"snntrain-compile": "default", "snntrain-reduce-overhead": "reduce-overhead",
            "snntrain-compile-graph": "default"}.get(provider)
    if case == "detector":
        return detector(provider, precision, backend, mode)
    if case in TRANSFORMER_CASES:
        return transformer(case, provider, precision, backend, mode)
    if provider in TRANSFORMER_PROVIDERS:
        return None
    c = CASES[case]
    model = (zoo_model(case, backend) if "model" in c else sew_model(case, backend)).cuda()
    if "nchw" not in provider:
        to_channels_last(model)
    set_backend(model, backend)
    unfuse(model, provider)
    fn = compile_model(model, mode)
    opt = build_optimizer(model, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    x, y = case_input(case, torch.Generator(device="cuda").manual_seed(0))
    step = classifier_step(fn, opt, x, y, precision, graph=provider.endswith("-graph"))
    return Bench(case, provider, precision, c["batch"], step)


def graph_step(objective, opt, precision: str, *inputs: torch.Tensor):
    """The step ``objective(*inputs)`` (a dict with ``"loss"``) under ``precision``, its backward and ``opt``'s
    update as one CUDA graph, as ``cuda_graph=true`` runs it (:class:`snntrain.tasks.step_graph.StepGraph`)."""
    from snntrain.tasks.step_graph import StepGraph, training_step_fn

    def under_precision(*x):
        with autocast(precision):
            return objective(*x)

    captured = StepGraph(training_step_fn(under_precision, opt), opt)
    return lambda: captured(*inputs)


def classifier_step(fn, opt, x: torch.Tensor, y: torch.Tensor, precision: str, graph: bool = False):
    """The training step forward (``fn``), cross-entropy, backward, ``opt`` step; with ``graph`` all of it one
    CUDA graph."""
    if graph:
        step = graph_step(lambda x, y: {"loss": torch.nn.functional.cross_entropy(fn(x), y)}, opt, precision, x, y)
    else:
        def step():
            with autocast(precision):
                loss = torch.nn.functional.cross_entropy(fn(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def detector(provider, precision, backend, mode) -> Bench:
    """The default detector's training step as the task computes it (``DetectionTask.objective``: network,
    target assignment and loss; with ``compile`` all of it in one graph), without Lightning around it."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from snntrain.data import build_datamodule
    from snntrain.tasks import TASKS
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import GRAPH_MODES, TrainingObjective, compile_model, to_channels_last

    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["task=detect", "paths.output_dir=/tmp/bench_train"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    dm = build_datamodule({**cfg["data"], "num_train": 64, "num_val": 8, "num_test": 8, "augment": False}, seed=0)
    dm.setup()
    images, targets = next(iter(dm.train_dataloader()))
    inputs = [t.cuda() for t in (images, targets["boxes"], targets["labels"], targets["num_boxes"])]
    torch.manual_seed(0)
    task = TASKS["detect"](cfg, backend=backend)
    model = task.model.cuda()
    if "nchw" not in provider:
        to_channels_last(model)
    unfuse(model, provider)
    fn = compile_model(TrainingObjective(model, task.objective), mode)
    opt = build_optimizer(model, cfg["task"]["optimizer"])
    graphs = mode in GRAPH_MODES
    if provider.endswith("-graph"):  # the whole step in one CUDA graph, as cuda_graph=true runs it
        step = graph_step(fn, opt, precision, *inputs)
    else:
        def step():
            if graphs:  # as the task does: a new iteration, the graphs may reuse the last step's outputs
                torch.compiler.cudagraph_mark_step_begin()
            with autocast(precision):
                loss = fn(*inputs)["loss"]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return Bench("detector", provider, precision, images.shape[0], step)


# ----------------------------------------------------------------------------- the floor: ResNet-18


def resnet18(case: str, provider: str, precision: str) -> Bench | None:
    """torchvision's ResNet-18 (ReLU, the same convolutions and batch norms, channels-last) at batch T x B:
    what our network would cost without spiking neurons and without the time axis."""
    import torchvision

    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    if case in TRANSFORMER_CASES:  # their floor is their own network with ReLU (relu-*)
        return None
    c = CASES[case]
    if case == "detector" or "model" in c:  # the model zoo's floor is its own network with ReLU (relu-*)
        return None
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=c.get("classes", CLASSES))
    if c.get("in_channels", 3) != 3:
        net.conv1 = torch.nn.Conv2d(c["in_channels"], 64, 7, 2, 3, bias=False)
    if c["stem"] == "cifar":
        net.conv1 = torch.nn.Conv2d(c.get("in_channels", 3), 64, 3, 1, 1, bias=False)
        net.maxpool = torch.nn.Identity()
    net = to_channels_last(net.cuda())
    fn = compile_model(net, "reduce-overhead" if provider.endswith("reduce-overhead") else None)
    opt = build_optimizer(net, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    g = torch.Generator(device="cuda").manual_seed(0)
    n = case_T(case) * c["batch"]
    x = torch.randn(n, c.get("in_channels", 3), c["size"], c["size"], device="cuda", generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, c.get("classes", CLASSES), (n,), device="cuda", generator=g)
    step = classifier_step(fn, opt, x, y, precision, graph=provider.endswith("-graph"))
    # images/s counted per image of our batch (B), so the row compares with ours at the same work
    return Bench(case, provider, precision, c["batch"], step, note=f"batch T*B={n}")


def relu_floor(case: str, provider: str, precision: str) -> Bench | None:
    """The case's own network with ReLU instead of spiking neurons (:func:`relu_twin`), T = 1, channels-last, at batch
    T x B: what the network would cost without spiking neurons and without the time axis."""
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    if case == "detector":
        return None
    if case in TRANSFORMER_CASES:
        return transformer_floor(case, provider, precision)
    c = CASES[case]
    model = zoo_model(case, "torch", T=1) if "model" in c else sew_model(case, "torch")
    if "model" not in c:
        model.T = 1
    net = to_channels_last(relu_twin(model).cuda())
    fn = compile_model(net, "reduce-overhead" if provider.endswith("reduce-overhead") else None)
    opt = build_optimizer(net, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    g = torch.Generator(device="cuda").manual_seed(0)
    n = case_T(case) * c["batch"]
    x = torch.randn(n, c.get("in_channels", 3), c["size"], c["size"], device="cuda", generator=g)
    if c.get("temporal"):  # the event case: T x B frames as one step each
        x = x.unsqueeze(0)
    x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
    y = torch.randint(0, c.get("classes", CLASSES), (n,), device="cuda", generator=g)
    step = classifier_step(fn, opt, x, y, precision, graph=provider.endswith("-graph"))
    return Bench(case, provider, precision, c["batch"], step, note=f"ReLU twin, T=1, batch T*B={n}")


# ----------------------------------------------------------------------------- the command line


def cli_overrides(case: str, precision: str, steps: int) -> list[str]:
    c = CASES[case]
    prec = ["trainer.precision=" + ("bf16-mixed" if precision == "bf16" else "32-true")]
    if case in TRANSFORMER_CASES:
        return transformer_cli_overrides(case, steps) + prec
    if case == "detector":
        return ["task=detect", "data.augment=false", f"data.batch_size={c['batch']}",
                f"data.num_train={steps * c['batch']}", "data.num_val=32", *prec]
    neuron = [f"model.neuron.type={case_neuron(case)['type']}", "model.neuron.tau=2.0",
              "model.neuron.detach_reset=false", "model.neuron.surrogate=sigmoid"]
    spec = c.get("model")
    if spec is None:
        model = [f"model.stem={c['stem']}", "model.width=64", "model.depth=18", "model.connect=ADD", *neuron,
                 *([f"model.spike_bytes={str(c['spike_bytes']).lower()}"] if "spike_bytes" in c else []),
                 *(["model.spike_fp8=true"] if c.get("spike_fp8") else [])]
    else:
        model = [f"model={spec['name']}", f"model.variant={spec['variant']}",
                 *(neuron if spec["name"] != "ms_resnet" else [])]
    out = ["task=classify", "data=synthetic", f"data.image_size={c['size']}", f"data.batch_size={c['batch']}",
           f"data.num_train={steps * c['batch']}", "data.num_val=64", f"data.in_channels={c.get('in_channels', 3)}",
           f"data.num_classes={c.get('classes', CLASSES)}", f"T={case_T(case)}", *model, "task.optimizer.name=sgd",
           "task.optimizer.lr=0.01", "task.optimizer.weight_decay=0.0", "task.optimizer.momentum=0.9", *prec]
    if c.get("temporal"):
        out.append(f"data.frames={case_T(case)}")
    return out


def command_line(case: str, provider: str, precision: str, args, pythonpath: str | None = None) -> dict:
    """``python -m snntrain`` on the case: the rate its speed monitor logs for the last epoch."""

    mode = ("reduce-overhead" if provider.endswith("reduce-overhead") else
            "default" if provider == "cli-compile-graph" else "null")
    graph = "true" if provider.endswith("-graph") else "false"
    tag = Path(pythonpath).name if pythonpath else "this"
    run = Path(args.out).resolve() / "runs" / f"{case}-{provider}-{precision}-{tag}"
    cmd = [sys.executable, "-m", "snntrain", *cli_overrides(case, precision, args.cli_steps), f"compile={mode}",
           # cli-eager: eager steps, without the whole-step graph that cuda_graph=auto (the default) would capture;
           # checkouts from before the setting run without it
           *([f"cuda_graph={graph}"] if pythonpath is None or graph == "true" else []),
           "backend=triton", "trainer.max_epochs=2", "trainer.enable_progress_bar=false", "logger=csv",
           "callbacks.precise_bn.num_batches=2", f"hydra.run.dir={run}"]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
        # a checkout from before the callbacks config group, and before data.frames
        cmd = [a.replace("callbacks.", "", 1) if a.startswith("callbacks.") else a for a in cmd]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=pythonpath or None)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(" | ".join(res.stderr.strip().splitlines()[-3:])[:600])
    rate = None
    with open(run / "csv" / "metrics.csv") as f:
        for r in csv.DictReader(f):
            if r.get("perf/train_images_per_s"):
                rate = float(r["perf/train_images_per_s"])
    if rate is None:
        raise RuntimeError(f"no perf/train_images_per_s in {run}")
    batch = CASES[case]["batch"]
    name = provider if not pythonpath else f"{provider}@{Path(pythonpath).name}"
    return row(case, name, precision, batch, wall, batch / rate * 1e3, 0, None,
               note=f"whole run {wall:.0f} s, {args.cli_steps} steps/epoch, rate of epoch 2")


def lightning_loop(case: str, precision: str, args) -> dict:
    """``lightning-loop``: the host time of Lightning's training loop alone, on this machine: ``Trainer.fit`` of
    a one-parameter model on a tiny batch (no logger, checkpoint, progress bar or callbacks of ours), timed over
    ``--steps`` steps after ``--warmup`` between two synchronisations. No step of the command line can take
    less; the case only names the row."""
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def training_step(self, batch, batch_idx):
            return (self.w * batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3, fused=True)

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.t0 = self.t1 = 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == args.warmup:
                torch.cuda.synchronize()
                self.t0 = time.perf_counter()
            elif trainer.global_step == args.warmup + args.steps:
                torch.cuda.synchronize()
                self.t1 = time.perf_counter()

    clock = Clock()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(64 * (args.warmup + args.steps), 4)),
                                       batch_size=64)
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=args.warmup + args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[clock], precision="bf16-mixed" if precision == "bf16" else "32-true")
    t0 = time.perf_counter()
    trainer.fit(Tiny(), data)
    ms = (clock.t1 - clock.t0) / args.steps * 1e3
    return row(case, "lightning-loop", precision, CASES[case]["batch"], time.perf_counter() - t0, ms, 0,
               note="Lightning's loop on a one-parameter model: the floor of a command-line step on this host")


# ----------------------------------------------------------------------------- SpikingJelly


def sj_network(case: str) -> torch.nn.Module:
    """SpikingJelly 2.0's network of ``case`` in multi-step mode: its ``sew_resnet18`` for the SEW cases, its
    constructor of the case's variant for the model zoo (LIF tau 2, sigmoid surrogate, no detach, as ours; its
    MS-ResNet with its own neuron)."""
    import importlib

    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    c = CASES[case]
    torch.manual_seed(0)
    lif = {"spiking_neuron": neuron.LIFNode, "surrogate_function": surrogate.Sigmoid(), "tau": 2.0,
           "detach_reset": False}
    spec = c.get("model")
    if spec is not None:
        module = importlib.import_module(f"spikingjelly.activation_based.model.{spec['name']}")
        if spec["name"] == "ms_resnet":  # static [B, C, H, W] input, repeated over its T inside, logits [B, K]
            net = getattr(module, spec["variant"])(T=case_T(case), num_classes=c.get("classes", CLASSES))
        else:
            net = getattr(module, spec["variant"])(num_classes=c.get("classes", CLASSES), **lif)
    else:
        from spikingjelly.activation_based.model import sew_resnet

        net = sew_resnet.sew_resnet18(cnf="ADD", num_classes=c.get("classes", CLASSES), **lif)
        if c.get("in_channels", 3) != 3:
            net.conv1 = layer.Conv2d(c["in_channels"], 64, 7, 2, 3, bias=False)
        if c["stem"] == "cifar":
            net.conv1 = layer.Conv2d(c.get("in_channels", 3), 64, 3, padding=1, bias=False)
            net.maxpool = torch.nn.Identity()
    functional.set_step_mode(net, "m")
    return net


def sj_precision(net, precision: str, note: str):
    """A SpikingJelly network ready for ``precision``: bf16 through its precision API
    (``neuron_storage="bf16"``, its autocast context), fp32 as it is; with the row's note saying which."""
    if precision != "bf16":
        return net, autocast(precision), note
    from spikingjelly.activation_based.precision import PrecisionConfig, prepare_model_for_precision

    art = prepare_model_for_precision(net, "cuda", PrecisionConfig(neuron_storage="bf16"))
    return art.model, art.autocast_context(), note + ", precision API neuron_storage=bf16"


def spikingjelly(case: str, precision: str, args, provider: str = "spikingjelly") -> dict:
    """SpikingJelly 2.0's step of the case's network (:func:`sj_network`, its Triton LIF), eager or, for
    ``spikingjelly-compile``, with the network under ``torch.compile`` (default mode)."""
    if case in TRANSFORMER_CASES:
        return spikingjelly_transformer(case, precision, args, provider)
    from spikingjelly.activation_based import functional

    c = CASES[case]
    net = sj_network(case)
    static = c.get("model", {}).get("name") == "ms_resnet"  # takes the image and averages over T itself
    net, ctx, note = sj_precision(net.cuda(), precision, "SJ_LIF_CUDA_IMPLEMENTATION=triton")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, fused=True)
    x, y = case_input(case, torch.Generator(device="cuda").manual_seed(0))
    steps = case_T(case)
    forward = torch.compile(net) if provider == "spikingjelly-compile" else net

    def step():
        functional.reset_net(net)
        with ctx:
            if static:
                logits = forward(x)
            else:
                logits = forward(x if x.dim() == 5 else x.unsqueeze(0).repeat(steps, 1, 1, 1, 1)).mean(0)
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return measure(Bench(case, provider, precision, c["batch"], step, note), args)


def run_spikingjelly(case: str, provider: str, precision: str, args) -> list[dict]:
    env = dict(os.environ, SJ_LIF_CUDA_IMPLEMENTATION="triton")
    cmd = [sys.executable, __file__, "--sj-worker", case, "--sj-provider", provider, "--precisions", precision,
           "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + (["--profile"] if args.profile else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    got = [line for line in res.stdout.splitlines() if line.startswith("ROW ")]
    if not got:
        print(f"{provider} {case} {precision} failed: {' | '.join(res.stderr.strip().splitlines()[-4:])[:600]}")
        return []
    return [json.loads(got[-1][4:])]


# ----------------------------------------------------------------------------- spiking transformers


def transformer_model(case: str, backend: str, **kw):
    """Our network of a transformer case (SpikingJelly's neuron settings: LIF, tau 2, reset detached, sigmoid)."""
    from snntrain.models import build_model

    c = TRANSFORMER_CASES[case]
    torch.manual_seed(0)
    cfg = {**c["model"], "num_classes": CLASSES, "in_channels": 3, "T": case_T(case),
           "neuron": {"type": "LIF", "tau": 2.0, "detach_reset": True, "surrogate": "sigmoid"}, **kw}
    return build_model(cfg, backend=backend)


def unfuse_transformer(model, fused: bool) -> None:
    """``*-unfused``: the norms and neurons, and the attention's product and neuron, each through its own kernels."""
    from snntrain.nn import NormNeuron
    from snntrain.nn.attention import QKVNeuron

    for m in model.modules():
        if isinstance(m, (NormNeuron, QKVNeuron)):
            m.fused = fused


def transformer(case: str, provider: str, precision: str, backend: str, mode: str | None) -> Bench | None:
    """Our transformer's training step (channels-last stems; ``-recompute``: activation recomputation)."""
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    if "nchw" in provider:
        return None
    recompute = provider.endswith("-recompute")
    model = to_channels_last(transformer_model(case, backend, checkpoint=recompute).cuda())
    unfuse_transformer(model, not provider.endswith("-unfused"))
    fn = compile_model(model, mode)
    opt = build_optimizer(model, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    x, y = case_input(case, torch.Generator(device="cuda").manual_seed(0))
    graph = provider.endswith("-graph") or provider == "snntrain-graph-recompute"
    step = classifier_step(fn, opt, x, y, precision, graph=graph)
    return Bench(case, provider, precision, CASES[case]["batch"], step, "recompute" if recompute else "")


def relu_network(model):
    """``model`` with ReLU instead of every neuron (the fused layers run their norm, then the ReLU; projections and
    convolutions keep their real-valued inputs as they are), in place."""
    from snntrain.nn import BaseNeuron
    from snntrain.nn.attention import SpikeLinear

    unfuse_transformer(model, False)
    plain_convolutions(model)
    for m in model.modules():
        if isinstance(m, SpikeLinear):
            m.narrow = False
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, BaseNeuron):
                setattr(module, name, torch.nn.ReLU())
    return model


def transformer_floor(case: str, provider: str, precision: str) -> Bench | None:
    """The same network with ReLU instead of its neurons, at T = 1 on T x B images: what it costs without spiking
    neurons and the time axis (the ``relu-*`` rows of a transformer case)."""
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    c = TRANSFORMER_CASES[case]
    model = to_channels_last(relu_network(transformer_model(case, "triton", T=1)).cuda())
    fn = compile_model(model, "reduce-overhead" if provider.endswith("reduce-overhead") else None)
    opt = build_optimizer(model, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    g = torch.Generator(device="cuda").manual_seed(0)
    n = case_T(case) * c["batch"]
    x = torch.randn(n, 3, c["size"], c["size"], device="cuda", generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (n,), device="cuda", generator=g)
    step = classifier_step(fn, opt, x, y, precision, graph=provider.endswith("-graph"))
    return Bench(case, provider, precision, c["batch"], step, note=f"ReLU network, T=1, batch T*B={n}")


def transformer_cli_overrides(case: str, steps: int) -> list[str]:
    c = TRANSFORMER_CASES[case]
    return ["task=classify", "data=synthetic", f"data.image_size={c['size']}", f"data.batch_size={c['batch']}",
            f"data.num_train={steps * c['batch']}", "data.num_val=64", "data.in_channels=3",
            f"data.num_classes={CLASSES}", f"T={case_T(case)}", f"model={c['model']}", f"model.variant={c['variant']}",
            "model.neuron.surrogate=sigmoid", "model.neuron.detach_reset=true", "task.optimizer.name=sgd",
            "task.optimizer.lr=0.01", "task.optimizer.weight_decay=0.0", "task.optimizer.momentum=0.9"]


def spikingjelly_transformer(case: str, precision: str, args, provider: str) -> dict:
    """SpikingJelly 2.0's constructor of the case's variant (its default LIF), eager or under ``torch.compile``; the
    image repeated over T as its models take it; its Spikformer's per-step logits averaged over T."""
    import importlib

    from spikingjelly.activation_based import functional

    c = TRANSFORMER_CASES[case]
    module = {"spikformer": "spikformer", "spike_driven_transformer": "spike_driven_transformer",
              "qkformer": "qkformer"}[c["model"]["name"]]
    build = getattr(importlib.import_module(f"spikingjelly.activation_based.model.{module}"), c["model"]["variant"])
    torch.manual_seed(0)
    kwargs = {"num_classes": CLASSES, "T": case_T(case)}
    if c["size"] != 224 and c["model"]["variant"] != "spikformer_cifar10":
        kwargs.update(img_size_h=c["size"], img_size_w=c["size"])
    net, ctx, note = sj_precision(build(**kwargs).cuda(), precision,
                                  f"SJ_LIF_CUDA_IMPLEMENTATION={os.environ.get('SJ_LIF_CUDA_IMPLEMENTATION', '')}")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, fused=True)
    x, y = case_input(case, torch.Generator(device="cuda").manual_seed(0))
    forward = torch.compile(net) if provider == "spikingjelly-compile" else net
    steps = case_T(case)

    def step():
        functional.reset_net(net)
        with ctx:
            out = forward(x.unsqueeze(0).repeat(steps, 1, 1, 1, 1))
            logits = out.mean(0) if out.dim() == 3 else out
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return measure(Bench(case, provider, precision, c["batch"], step, note), args)


# ----------------------------------------------------------------------------- output


def save(rows: list[dict], out: Path) -> None:
    bu.write_rows(rows, out, NAME)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = sorted({(r["case"], r["precision"]) for r in rows})
    provs = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(keys)), 4.5))
    width = 0.8 / max(1, len(provs))
    for i, p in enumerate(provs):
        vals = [next((r["images_per_s"] for r in rows if (r["case"], r["precision"]) == k and r["provider"] == p), 0)
                for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], vals, width, label=p)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [f"{c}\n{p}" for c, p in keys], fontsize=8)
    ax.set_ylabel("images / s (training)")
    ax.set_title(f"Training steps ({rows[0]['gpu']}, {rows[0]['date']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench_train.png", dpi=120)


def print_rows(rows: list[dict]) -> None:
    print(f"\nGPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  date {time.strftime('%Y-%m-%d')}")
    head = (f"{'case':12s} {'prec':5s} {'provider':26s} {'ms/step':>8s} {'min-max':>13s} {'vs floor':>8s} "
            f"{'img/s':>8s} {'peak MiB':>9s} {'first s':>8s}")
    print(head + "  " + " ".join(f"{k[:6]:>6s}" for k in KINDS))
    for r in rows:
        spread = f"{r['ms_min']:.2f}-{r['ms_max']:.2f}" if r["rounds"] > 1 else ""
        vs = f"{r['vs_floor']:.3f}" if r["vs_floor"] != "" else ""
        print(f"{r['case']:12s} {r['precision']:5s} {r['provider']:26s} {r['ms_per_step']:8.2f} {spread:>13s} "
              f"{vs:>8s} {r['images_per_s']:8.1f} {r['peak_mem_mib']:9.1f} {r['first_calls_s']:8.1f}  "
              + " ".join(f"{r[f'ms_{k}']:6.2f}" if r[f"ms_{k}"] != "" else f"{'':6s}" for k in KINDS))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=list(PROVIDERS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--profile", action="store_true", help="GPU-time breakdown by kind for every row")
    p.add_argument("--rounds", type=int, default=1,
                   help="time the in-process providers (snntrain-*, resnet18-*) of each case in this many rounds, "
                        "taking turns, and report medians (see interleaved())")
    p.add_argument("--cli-steps", type=int, default=60, help="training steps per epoch of the cli-* runs")
    p.add_argument("--cli-pythonpath", nargs="*", default=[],
                   help="other checkouts whose command line to run as well, in every cli-* provider's mode "
                        "(cli-*@<folder> rows)")
    p.add_argument("--sj-worker", help=argparse.SUPPRESS)
    p.add_argument("--sj-provider", default="spikingjelly", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    if args.sj_worker:
        print("ROW " + json.dumps(spikingjelly(args.sj_worker, args.precisions[0], args, args.sj_provider)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    (out / f"{NAME}.jsonl").unlink(missing_ok=True)  # this run's rows, appended as each case finishes
    def bench(case: str, prov: str, prec: str) -> Callable[[], Bench | None]:
        make = resnet18 if prov.startswith("resnet18") else relu_floor if prov.startswith("relu") else ours
        return lambda: make(case, prov, prec)

    for case in args.cases:
        for prec in args.precisions:
            own = [p for p in args.providers if p.startswith(OWN)]
            together = own if args.rounds > 1 else []
            case_rows = []
            if together:
                torch._dynamo.reset()
                try:
                    case_rows += interleaved([bench(case, p, prec) for p in together], args)
                except Exception as err:  # noqa: BLE001 - report and go on with the other rows
                    print(f"{case} {prec} {' '.join(together)}: {type(err).__name__}: {str(err)[:400]}")
                finally:
                    torch.cuda.empty_cache()
            for prov in args.providers:
                if prov in together or (prov.startswith("spikingjelly") and case == "detector"):
                    continue
                try:
                    if prov.startswith("spikingjelly"):
                        new = run_spikingjelly(case, prov, prec, args)
                    elif prov == "lightning-loop":
                        new = [lightning_loop(case, prec, args)]
                    elif prov.startswith("cli-"):
                        new = [command_line(case, prov, prec, args, path) for path in [None, *args.cli_pythonpath]]
                    else:
                        torch._dynamo.reset()
                        b = bench(case, prov, prec)()
                        new = [] if b is None else [measure(b, args)]
                except Exception as err:  # noqa: BLE001 - report and go on with the other rows
                    print(f"{case} {prec} {prov}: {type(err).__name__}: {str(err)[:400]}")
                    continue
                finally:
                    torch.cuda.empty_cache()
                for r in new:
                    case_rows.append(r)
                    print(f"  {case} {prec} {prov}: {r['ms_per_step']:.2f} ms, {r['peak_mem_mib']:.0f} MiB, "
                          f"first calls {r['first_calls_s']:.1f} s", flush=True)
            floor_ratios(case_rows)
            for r in case_rows:
                rows.append(r)
                bu.append_row(r, out, NAME)
    if rows:
        save(rows, out)
        print_rows(rows)


if __name__ == "__main__":
    main()
