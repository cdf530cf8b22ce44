"""Benchmark of the efficiency report's counting kernels against PyTorch and the memory roofline.

    python scripts/bench_synops.py --out DIR [--quick] [--sweep]

What validation with the report adds per layer and batch (``snntrain.efficiency.ActivityCounter`` on CUDA):

* ``synops``: the effective synaptic operations, nonzeros and non-binary inputs of a convolution's input
  (``snntrain.kernels.synops.launch``, one read of the input);
* ``channel-sums``: the spikes per channel of a spiking layer's output ``[T, B, C, H, W]``
  (``launch_channel_sums``, one read).

Providers: ``ours`` (the kernels as the counter launches them, plan and fan-out map made once),
``torch`` (what the PyTorch path does: ``torch.sum`` over every dim but the channels for the spikes,
:func:`snntrain.efficiency.count_reference` for the synaptic operations), and ``read`` (``torch.sum`` of the
whole tensor into one number: what a single read of these bytes costs in PyTorch). ``bytes`` is the input
once: both kernels are one read, so ``roofline`` 1.0 is the copy bandwidth of the same run.

Cases: the maps of SEW-ResNet-18 in validation, channels-last (as ``channels_last=auto`` runs on a GPU),
fp32 and bf16: CIFAR-size (T*B = 1024 frames: 64 x 32 x 32, 512 x 4 x 4) and ImageNet-size (T*B = 256:
64 x 56 x 56, 512 x 7 x 7). ``--sweep`` times ours over BLOCK and programs per SM (the module's constants)
and prints the fastest, for retuning on another GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_utils as bu  # noqa: E402
from snntrain import efficiency as E  # noqa: E402
from snntrain.kernels import synops as K  # noqa: E402

CASES = [(1024, 64, 32, 32), (1024, 512, 4, 4), (256, 64, 56, 56), (256, 512, 7, 7)]
QUICK = [(1024, 64, 32, 32), (256, 512, 7, 7)]


def spikes(frames: int, c: int, h: int, w: int, dtype: torch.dtype) -> torch.Tensor:
    """Channels-last spikes (20 % ones), ``[frames, C, H, W]``."""
    x = (torch.rand(frames, c, h, w, device="cuda") < 0.2).to(dtype)
    return x.contiguous(memory_format=torch.channels_last)


def run_case(shape, dtype, quick: bool) -> list[bu.Row]:
    frames, c, h, w = shape
    x = spikes(frames, c, h, w, dtype)
    nbytes = x.numel() * x.element_size()
    text = f"{frames}x{c}x{h}x{w}"
    rows = []
    # synaptic operations of a 3x3 convolution (stride 1, padding 1) reading x
    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False).cuda()
    geo, m = E.geometry(conv, x.shape), E.weight_fanin(conv)
    p = K.plan(tuple(x.shape), x.stride(), 3, device=x.device)
    fan = K.fan_block(E.fanout_map(m, geo, x.shape[2:]), p)
    out = torch.zeros(3, dtype=torch.int64, device="cuda")
    K.launch(p, x, fan, out)
    assert out.tolist() == E.count_reference(x, m, geo).tolist()
    rows.append(bu.Row("synops", "synops", "count", "ours", str(dtype).split(".")[-1], text,
                       bu.bench_ms(lambda: K.launch(p, x, fan, out), quick), nbytes))
    if frames * c * h * w <= 1 << 26:  # the matrix-product reference: slow, so the smaller cases only
        ref_fan = E.fanout_map(m, geo, x.shape[2:])
        rows.append(bu.Row("synops", "synops", "count", "torch", str(dtype).split(".")[-1], text,
                           bu.bench_ms(lambda: E.count_reference(x, m, geo, ref_fan), quick), nbytes))
    # spikes per channel of the same maps seen as a spiking layer's output [T, B, C, H, W]
    s = x.view(4, frames // 4, c, h, w)
    ps = K.plan(tuple(s.shape), s.stride(), 3, device=s.device, sums=True)
    chan = K.channel_block(ps, s.device)
    sums = torch.zeros(c, dtype=torch.float32, device="cuda")
    K.launch_channel_sums(ps, s, chan, sums)
    torch.testing.assert_close(sums, s.float().sum(dim=(0, 1, 3, 4)), rtol=0, atol=0)
    rows.append(bu.Row("synops", "channel-sums", "count", "ours", str(dtype).split(".")[-1], text,
                       bu.bench_ms(lambda: K.launch_channel_sums(ps, s, chan, sums), quick), nbytes))
    row = torch.zeros(c, dtype=torch.float32, device="cuda")
    rows.append(bu.Row("synops", "channel-sums", "count", "torch", str(dtype).split(".")[-1], text,
                       bu.bench_ms(lambda: torch.sum(s, dim=[0, 1, 3, 4], dtype=torch.float32, out=row), quick),
                       nbytes))
    one = torch.zeros((), dtype=torch.float32, device="cuda")
    rows.append(bu.Row("synops", "read", "count", "torch", str(dtype).split(".")[-1], text,
                       bu.bench_ms(lambda: torch.sum(x, dim=(0, 1, 2, 3), dtype=torch.float32, out=one), quick), nbytes,
                       note="one read: sum of all"))
    return rows


def sweep(copy_gbps: float) -> None:
    """Ours over BLOCK x programs per SM x warps, per case and kernel (the module constants are read at each
    plan and launch)."""
    saved = K.BLOCK, K.PROGRAMS_PER_SM, K.NUM_WARPS, K.SUMS_PROGRAMS_PER_SM, K.SUMS_NUM_WARPS
    for shape in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            x = spikes(*shape, dtype)
            s = x.view(4, shape[0] // 4, *shape[1:])
            roof = x.numel() * x.element_size() / copy_gbps / 1e6
            conv = torch.nn.Conv2d(shape[1], shape[1], 3, padding=1, bias=False).cuda()
            geo, m = E.geometry(conv, x.shape), E.weight_fanin(conv)
            syn, sums = {}, {}
            for block in (512, 1024, 2048):
                for per_sm in (4, 8, 16):
                    for warps in (4, 8):
                        K.BLOCK = block
                        K.PROGRAMS_PER_SM = K.SUMS_PROGRAMS_PER_SM = per_sm
                        K.NUM_WARPS = K.SUMS_NUM_WARPS = warps
                        p = K.plan(tuple(x.shape), x.stride(), 3, device=x.device)
                        fan = K.fan_block(E.fanout_map(m, geo, x.shape[2:]), p)
                        out = torch.zeros(3, dtype=torch.int64, device="cuda")
                        syn[block, per_sm, warps] = roof / bu.bench_ms(lambda: K.launch(p, x, fan, out), True)
                        ps = K.plan(tuple(s.shape), s.stride(), 3, device=s.device, sums=True)
                        chan = K.channel_block(ps, s.device)
                        total = torch.zeros(shape[1], dtype=torch.float32, device="cuda")
                        sums[block, per_sm, warps] = roof / bu.bench_ms(
                            lambda: K.launch_channel_sums(ps, s, chan, total), True)
            K.BLOCK, K.PROGRAMS_PER_SM, K.NUM_WARPS, K.SUMS_PROGRAMS_PER_SM, K.SUMS_NUM_WARPS = saved
            for name, res, now in (("synops", syn, saved[:3]), ("sums", sums, (saved[0], *saved[3:]))):
                best = sorted(res.items(), key=lambda kv: -kv[1])[:3]
                print(f"sweep {name} {shape} {dtype}: now (BLOCK, per SM, warps)={now} {res[now]:.2f} x roofline; "
                      "best " + "; ".join(f"{k} {v:.2f}" for k, v in best), flush=True)


def main() -> None:
    args = bu.parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--sweep", action="store_true"))
    bu.device()
    copy_gbps = bu.copy_bandwidth()
    rows = []
    for shape in QUICK if args.quick else CASES:
        for dtype in (torch.float32, torch.bfloat16):
            rows += run_case(shape, dtype, args.quick)
            torch.cuda.empty_cache()
    bu.finish(rows, copy_gbps, args.out, "synops", "Counting kernels of the efficiency report")
    if args.sweep:
        sweep(copy_gbps)


if __name__ == "__main__":
    main()
