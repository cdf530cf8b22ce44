"""Benchmark the FP8 convolutions of spikes (:mod:`snntrain.kernels.spike_conv`) against cuDNN's bf16 convolution.

    python scripts/bench_spike_conv.py --out DIR [--quick]
    python scripts/bench_spike_conv.py --out DIR --sweep [--budget SECONDS]   # our launch sizes, per layer shape
    python scripts/bench_spike_conv.py --out DIR --dry-run    # no GPU: tiny shapes in Triton's interpreter

Cases: the convolutions of spikes in SEW-ResNet-18 at 224x224, batch 32, T = 4 (``N = 128`` maps; the 3x3
convolutions of each stage, the first of a stage with stride 2, and the 1x1 stride-2 shortcuts), channels-last,
spikes (0/1, a fifth of them 1) in bf16; and ``sew18-224/all``, each shape times its number of layers.
Providers, forward only (the backward is the same for all: PyTorch's convolution backward): ``cudnn-bf16``
(``F.conv2d`` under bf16, channels-last, with ``torch.backends.cudnn.benchmark`` on as ``trainer.benchmark=auto``
sets it: what the step runs without the option), ``ours-fp8`` (the weight rounded
per output channel, then the FP8 convolution: what a training forward runs with ``spike_fp8``) and
``ours-fp8-conv`` (the convolution alone). Every time is a CUDA-graph replay (GPU time only); ``tflops`` in the note
is ``2 N Ho Wo Cout Cin KH KW`` over the time. ``roofline`` = (input bf16 + weight + output bf16 bytes / copy
bandwidth) / time. Writes ``DIR/bench_spike_conv.csv``, ``.jsonl`` and ``.png``; ``--sweep`` prints one line per
launch configuration, input cast (``spike_conv_tuning.PRECAST``) and shape (``DIR/bench_spike_conv_sweep.txt``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench_utils as bu  # noqa: E402
from bench_dry import DEVICE, DRY  # noqa: E402  (before snntrain: --dry-run sets Triton's interpreter)
from snntrain.kernels import spike_conv  # noqa: E402
from snntrain.kernels import spike_conv_tuning as tuning  # noqa: E402

NAME = "bench_spike_conv"
#: SEW-ResNet-18 at 224, batch 32, T = 4: (label, Cin, H = W, Cout, kernel, stride, layers of this shape)
SHAPES = [("layer1", 64, 56, 64, 3, 1, 4), ("layer2 first", 64, 56, 128, 3, 2, 1), ("layer2 shortcut", 64, 56, 128, 1, 2, 1),
          ("layer2", 128, 28, 128, 3, 1, 3), ("layer3 first", 128, 28, 256, 3, 2, 1),
          ("layer3 shortcut", 128, 28, 256, 1, 2, 1), ("layer3", 256, 14, 256, 3, 1, 3),
          ("layer4 first", 256, 14, 512, 3, 2, 1), ("layer4 shortcut", 256, 14, 512, 1, 2, 1),
          ("layer4", 512, 7, 512, 3, 1, 3)]
N = 128
PROVIDERS = ("cudnn-bf16", "ours-fp8", "ours-fp8-conv")
#: ``--sweep``: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages), each with the input cast to e4m3 first and read
#: in its own dtype (``spike_conv_tuning.PRECAST``); BLOCK_N above Cout and BLOCK_K above Cin are skipped
SWEEP = [(128, 64, 64, 8, 4, 4), (128, 128, 64, 8, 4, 4), (128, 128, 128, 8, 4, 3), (64, 128, 128, 8, 4, 4),
         (128, 256, 128, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 4), (128, 128, 128, 8, 4, 4),
         (128, 256, 128, 8, 8, 4)]


def case(cin, h, cout, k, seed=0):
    n = N
    if DRY:
        n, h, cin, cout = 2, min(h, 6), 32, min(cout, 48)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.rand((n, cin, h, h), device=DEVICE, generator=g) < 0.2).to(torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn((cout, cin, k, k), device=DEVICE, generator=g) * (2.0 / (cin * k * k)) ** 0.5
    return x, w


def calls(x, w, k, stride):
    """provider -> its forward, each checked against the convolution with the rounded weight first."""
    pad = k // 2
    conv = (list(w.shape[2:]), [stride] * 2, [pad] * 2, [1, 1], torch.bfloat16)
    wb = w.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    q, s = spike_conv.quantize_weight(w)
    ours = spike_conv.conv2d(x, q, s, None, *conv)
    ref = spike_conv.conv2d_reference(x, q, s, None, *conv)
    err = (ours.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1e-6)
    if err > 2e-2:
        raise AssertionError(f"the FP8 convolution is {err:.3g} (relative) off its reference")
    return {"cudnn-bf16": lambda: F.conv2d(x, wb, None, stride, pad),
            "ours-fp8": lambda: spike_conv.conv2d(x, *spike_conv.quantize_weight(w), None, *conv),
            "ours-fp8-conv": lambda: spike_conv.conv2d(x, q, s, None, *conv)}


def time_ms(fn, quick):
    if DRY:
        fn()
        return 1.0, ""
    return bu.graph_ms(fn, quick)


def run(quick):
    rows, total = [], {p: 0.0 for p in PROVIDERS}
    for label, cin, h, cout, k, stride, count in SHAPES:
        x, w = case(cin, h, cout, k)
        n, c, hh, ww = x.shape
        ho = (hh + 2 * (k // 2) - k) // stride + 1
        flops = 2 * n * ho * ho * w.shape[0] * c * k * k
        nbytes = x.numel() * 2 + w.numel() * 2 + n * ho * ho * w.shape[0] * 2
        for provider, fn in calls(x, w, k, stride).items():
            ms, note = time_ms(fn, quick)
            total[provider] += count * ms
            rows.append(bu.Row(f"spike_conv/sew18-224/{label}", f"conv{k}x{k}s{stride}", "fwd", provider, "bf16",
                               f"{n}x{c}x{hh}x{ww}->{w.shape[0]}", ms, nbytes,
                               note=f"{flops / ms / 1e9:.0f} TFLOPS; {count} layer(s)" + (f"; {note}" if note else "")))
            print(f"{label} {provider}: {ms:.4f} ms ({flops / ms / 1e9:.0f} TFLOPS)", flush=True)
    for provider, ms in total.items():
        rows.append(bu.Row("spike_conv/sew18-224/all", "conv", "fwd", provider, "bf16", "19 layers", ms, 0))
        print(f"all 19 layers {provider}: {ms:.3f} ms", flush=True)
    return rows


def sweep(quick, deadline, out):
    lines = []
    for label, cin, h, cout, k, stride, _ in SHAPES:
        x, w = case(cin, h, cout, k)
        q, s = spike_conv.quantize_weight(w)
        conv = ([k, k], [stride] * 2, [k // 2] * 2, [1, 1], torch.bfloat16)
        wb = w.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        base, _ = time_ms(lambda: F.conv2d(x, wb, None, stride, k // 2), quick)
        cells = [f"cudnn {base:.4f}", f"default {tuning.conv_config(cin, cout, k * k)}"]
        saved, saved_precast = tuning.conv_config, tuning.PRECAST
        for cfg in [None] + SWEEP:
            if cfg is not None and (cfg[1] > max(64, cout) or cfg[2] > (cin & -cin)):
                continue
            for precast in (True, False):
                what = f"{'default' if cfg is None else cfg}{'' if precast else ' in registers'}"
                if time.time() > deadline:
                    cells.append(f"{what}: out of time")
                    continue
                if cfg is not None:
                    tuning.conv_config = lambda *a, cfg=cfg: cfg
                tuning.PRECAST = precast
                try:
                    ms, _ = time_ms(lambda: spike_conv.conv2d(x, q, s, None, *conv), quick)
                    cells.append(f"{what}: {ms:.4f} ({base / ms:.2f}x)")
                except Exception as err:  # noqa: BLE001 - a configuration that fails is reported, not fatal
                    cells.append(f"{what}: {type(err).__name__}")
                finally:
                    tuning.conv_config, tuning.PRECAST = saved, saved_precast
        line = f"{label} {N}x{cin}x{h}x{h} -> {cout}, {k}x{k}/{stride}: " + "; ".join(cells)
        print(line, flush=True)
        lines.append(line)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"{NAME}_sweep.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    def extra(p):
        p.add_argument("--dry-run", action="store_true", help="no GPU: tiny shapes in Triton's interpreter, fake times")
        p.add_argument("--sweep", action="store_true", help="time our convolution over launch sizes, per shape")
        p.add_argument("--budget", type=float, default=300.0, help="seconds for --sweep (default 300)")

    args = bu.parse_args(__doc__.splitlines()[0], extra)
    if not DRY:
        bu.device()
        torch.backends.cudnn.benchmark = True  # what the training step runs with (trainer.benchmark=auto)
        reason = spike_conv.fp8_device_reason(torch.device("cuda"))
        if reason:
            sys.exit(reason)
    if args.sweep:
        sweep(args.quick, time.time() + args.budget, args.out)
        return
    copy_gbps = 1000.0 if DRY else bu.copy_bandwidth()
    bu.finish(run(args.quick), copy_gbps, args.out, NAME, "FP8 convolutions of spikes")


if __name__ == "__main__":
    main()
