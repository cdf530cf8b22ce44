"""Benchmark the packing of spikes that a convolution keeps for its backward (:mod:`snntrain.kernels.spike_pack`).

    python scripts/bench_pack.py --out DIR [--quick]
    python scripts/bench_pack.py --out DIR --dry-run    # no GPU: tiny shapes in Triton's interpreter, fake times

Cases: the spike maps SEW-ResNet-18 convolves at 224x224, batch 32, T = 4, bf16 channels-last: the pooled stem's
(``[128, 64, 56, 56]``) and the last stage's (``[128, 512, 7, 7]``); 1 bit an element (binary spikes) and 2 bits
(SEW ADD's sums up to 3). Modes: ``pack`` (the forward: the spikes to their packed form), ``unpack`` (the
backward: back to bf16), ``pack+unpack``; every time a CUDA-graph replay (GPU time only).

Providers: ``ours-triton`` (the kernels), ``ours-torch`` (:func:`~snntrain.kernels.spike_pack.pack_reference`, the
same bytes in PyTorch operations: the torch backend) and ``torch-uint8`` (``x.to(torch.uint8)`` and back: one byte
an element, what a plain cast keeps). Bytes (``E`` the bf16 map's bytes, ``n`` its elements, ``b`` the bits):
``pack`` = E + n b / 8, ``unpack`` the same, ``pack+unpack`` twice that; for ``torch-uint8`` b = 8. ``roofline``
= (bytes / copy bandwidth) / time, the copy bandwidth measured in the same run. The ``note`` column gives the MB
kept for the backward. Writes ``DIR/bench_pack.csv``, ``.jsonl`` and ``.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import bench_utils as bu  # noqa: E402
from bench_dry import DEVICE, DRY  # noqa: E402  (before snntrain: --dry-run sets Triton's interpreter)
from snntrain.kernels import spike_pack  # noqa: E402

NAME = "bench_pack"
CASES = [("pack/sew18-224", "stem", (128, 64, 56, 56)), ("pack/sew18-224", "layer4", (128, 512, 7, 7))]
MODES = ("pack", "unpack", "pack+unpack")
PROVIDERS = ("ours-triton", "ours-torch", "torch-uint8")


def spikes(shape, bits):
    if DRY:
        shape = (2, min(shape[1], 16), 5, 5)
    g = torch.Generator(device=DEVICE).manual_seed(bits)
    x = torch.randint(0, 1 << bits, shape, device=DEVICE, generator=g) * (torch.rand(shape, device=DEVICE,
                                                                                     generator=g) < 0.2)
    return x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)


def calls(provider, x, bits):
    """(pack, unpack) callables of ``provider`` on ``x``; unpack reads what one pack wrote."""
    if provider == "torch-uint8":
        kept = x.to(torch.uint8)
        return (lambda: x.to(torch.uint8)), (lambda: kept.to(torch.bfloat16))
    pack, unpack = ((spike_pack.pack, spike_pack.unpack) if provider == "ours-triton" else
                    (spike_pack.pack_reference, spike_pack.unpack_reference))
    kept = pack(x, bits)
    if not torch.equal(unpack(kept, bits, x.shape, x.stride(), x.dtype), x):
        raise AssertionError(f"{provider} does not unpack what it packed")
    return (lambda: pack(x, bits)), (lambda: unpack(kept, bits, x.shape, x.stride(), x.dtype))


def run(quick):
    rows = []
    for bench, label, shape in CASES:
        for bits in (1, 2):
            x = spikes(shape, bits)
            n, e = x.numel(), x.numel() * x.element_size()
            for provider in PROVIDERS:
                width = 8 if provider == "torch-uint8" else bits
                pack, unpack = calls(provider, x, bits)
                kept = spike_pack.packed_bytes(n, width)
                for mode, fns, nbytes in (("pack", [pack], e + kept), ("unpack", [unpack], e + kept),
                                          ("pack+unpack", [pack, unpack], 2 * (e + kept))):
                    if DRY:
                        for f in fns:
                            f()
                        ms, note = 1.0, ""
                    else:
                        ms, note = bu.graph_ms(lambda: [f() for f in fns], quick)
                    rows.append(bu.Row(f"{bench}/{label}", f"pack{bits}", mode, provider, "bf16",
                                       "x".join(map(str, x.shape)), ms, nbytes,
                                       note=f"keeps {kept / 1e6:.2f} MB" + (f"; {note}" if note else "")))
                    print(f"{bench}/{label} {bits} bit {provider} {mode}: {ms:.4f} ms", flush=True)
    return rows


def main() -> None:
    def extra(p):
        p.add_argument("--dry-run", action="store_true", help="no GPU: tiny shapes in Triton's interpreter, fake times")

    args = bu.parse_args(__doc__.splitlines()[0], extra)
    if not DRY:
        bu.device()
    copy_gbps = 1000.0 if DRY else bu.copy_bandwidth()
    bu.finish(run(args.quick), copy_gbps, args.out, NAME, "Spikes packed for a convolution's backward")


if __name__ == "__main__":
    main()
