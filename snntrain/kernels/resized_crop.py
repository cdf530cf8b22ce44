"""Batched resized crop for the image loader: crop, resize, flip and normalise a whole batch of
decoded images of different sizes in one launch.

Image ``b`` of the batch is a ``[C, H_b, W_b]`` uint8 block of one flat buffer (the decoded images
back to back). The kernel takes the box ``(top, left, height, width)`` of each image, resizes it to
``S x S`` with antialiased bilinear filtering, mirrors it left-right where ``flip`` is set and writes
``pixel * mul[c] + add[c]`` (normalisation by mean and standard deviation folded into one
multiply-add) in the output's dtype (fp32 or bf16) through the output's strides, so it can write a
channels-last batch directly.

The filter is exactly the one of ``torch.nn.functional.interpolate(box, (S, S), mode="bilinear",
align_corners=False, antialias=True)`` applied to the float box (PyTorch's and PIL's): along each
axis with scale ``s = in / out``, output pixel ``i`` has centre ``c = s * (i + 0.5)``, support
``r = max(s, 1)``, source pixels ``floor(c - r + 0.5) .. floor(c + r + 0.5) - 1`` clipped to the box,
triangle weights ``max(0, 1 - |(j - c + 0.5) / r|)`` normalised to sum 1; downscaling therefore
averages over the footprint instead of aliasing, upscaling is plain bilinear. The box must lie
inside its image; the weights never reach outside the box. Math is fp32.

A program computes ``BLOCK`` output pixels of one channel of one image: grid
``(cdiv(S * S, BLOCK), B * C)``. Its two tap loops run to the image's largest footprint,
``floor(2 * max(s, 1)) + 2`` source pixels per axis, with masks for shorter ones; the work per output
pixel grows with the square of the downscaling factor (about 2-3 for ImageNet's images at 224).
Nothing here synchronises with the host. This is a data-path kernel called eagerly before the training step
(outside any compiled graph), so it is not registered as an operator; the PyTorch reference it is
tested against is ``snntrain.data.device_decode.resized_crop_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .op_utils import cdiv

#: columns of the per-image ``meta`` rows
META = ("offset", "height", "width", "top", "left", "box_height", "box_width", "flip")
BLOCK = 256


@triton.jit
def _resized_crop_kernel(
    src_ptr,    # uint8 [total]: the images back to back, image b a [C, H, W] block at meta[b, 0]
    meta_ptr,   # int64 [B, 8]: offset, H, W, top, left, box height, box width, flip
    norm_ptr,   # float32 [C, 2]: out = pixel * norm[c, 0] + norm[c, 1]
    out_ptr,    # [B, C, S, S] float32 or bfloat16, strides below
    so_b, so_c, so_y, so_x,
    S,
    C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    bc = tl.program_id(1)
    b = bc // C
    c = bc % C
    m = meta_ptr + b * 8
    offset = tl.load(m)
    H = tl.load(m + 1)
    W = tl.load(m + 2)
    top = tl.load(m + 3)
    left = tl.load(m + 4)
    h = tl.load(m + 5)
    w = tl.load(m + 6)
    flip = tl.load(m + 7)

    idx = pid * BLOCK + tl.arange(0, BLOCK)
    inb = idx < S * S
    oy = idx // S
    ox = idx % S
    sx = tl.where(flip != 0, S - 1 - ox, ox)  # column of the unflipped resized box

    # rows: centre, support, first source row and count (PyTorch's antialiased weights)
    scale_y = h.to(tl.float32) / S
    sup_y = tl.maximum(scale_y, 1.0)
    taps_y = (2.0 * sup_y).to(tl.int32) + 2  # the most source rows one output row reads
    inv_y = 1.0 / sup_y
    cy = scale_y * (oy.to(tl.float32) + 0.5)
    ymin = tl.maximum((cy - sup_y + 0.5).to(tl.int32), 0)
    ysize = tl.minimum((cy + sup_y + 0.5).to(tl.int32), h.to(tl.int32)) - ymin
    # columns
    scale_x = w.to(tl.float32) / S
    sup_x = tl.maximum(scale_x, 1.0)
    taps_x = (2.0 * sup_x).to(tl.int32) + 2
    inv_x = 1.0 / sup_x
    cx = scale_x * (sx.to(tl.float32) + 0.5)
    xmin = tl.maximum((cx - sup_x + 0.5).to(tl.int32), 0)
    xsize = tl.minimum((cx + sup_x + 0.5).to(tl.int32), w.to(tl.int32)) - xmin

    total_x = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(0, taps_x):
        wx = tl.maximum(1.0 - tl.abs((k + xmin - cx + 0.5) * inv_x), 0.0)
        total_x += tl.where(k < xsize, wx, 0.0)

    base = src_ptr + offset + c * H * W + top * W + left
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    total_y = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, taps_y):
        wy = tl.maximum(1.0 - tl.abs((j + ymin - cy + 0.5) * inv_y), 0.0)
        row_ok = inb & (j < ysize)
        wy = tl.where(row_ok, wy, 0.0)
        total_y += wy
        row = base + (ymin + j).to(tl.int64) * W + xmin
        row_acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k in range(0, taps_x):
            wx = tl.maximum(1.0 - tl.abs((k + xmin - cx + 0.5) * inv_x), 0.0)
            ok = row_ok & (k < xsize)
            v = tl.load(row + k, mask=ok, other=0).to(tl.float32)
            row_acc += tl.where(ok, wx, 0.0) * v
        acc += wy * row_acc

    value = acc / tl.maximum(total_y * total_x, 1e-20)
    value = value * tl.load(norm_ptr + c * 2) + tl.load(norm_ptr + c * 2 + 1)
    dst = out_ptr + b.to(tl.int64) * so_b + c * so_c + oy.to(tl.int64) * so_y + ox.to(tl.int64) * so_x
    tl.store(dst, value.to(out_ptr.dtype.element_ty), mask=inb)


def resized_crop(src: torch.Tensor, meta: torch.Tensor, norm: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Launch the kernel: ``src`` the flat uint8 images, ``meta`` their ``[B, 8]`` int64 rows (:data:`META`),
    ``norm`` ``[C, 2]`` float32, ``out`` the ``[B, C, S, S]`` result (fp32 or bf16, any strides), all on
    one device."""
    B, C, S, S2 = out.shape
    if S != S2:
        raise ValueError(f"the output must be square [B, C, S, S]; got {tuple(out.shape)}")
    if src.dtype != torch.uint8 or meta.dtype != torch.int64 or norm.dtype != torch.float32:
        raise TypeError(f"src must be uint8, meta int64 and norm float32; got {src.dtype}, {meta.dtype}, {norm.dtype}")
    if out.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out must be float32 or bfloat16; got {out.dtype}")
    if B == 0:
        return out
    grid = (cdiv(S * S, BLOCK), B * C)
    _resized_crop_kernel[grid](src, meta, norm, out, *out.stride(), S, C=C, BLOCK=BLOCK)
    return out
