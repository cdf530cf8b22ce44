"""The per-layer chart of a report (TensorBoard's ``efficiency/per_layer`` and ``task=report``'s ``report.png``).

One row per layer in forward order: a connection layer's effective ACs (blue) and MACs (orange) over its dense
operations (grey), on the synaptic-operations axis; a spiking layer's firing rate (green) on the firing-rate axis.
Each row ends with its value, and each axis is drawn under the rows with its name, ticks and tick values. Text is
drawn from glyphs rendered once (PIL's default font) and the layer names, legend and axis lines once per list of
layers, so a chart per validation costs array writes and the encoding.
"""

from __future__ import annotations

import math
from typing import Any

from .report import _si

_CHART_BASES: dict[tuple, Any] = {}
_GLYPHS: dict[str, Any] = {}
#: The chart's colours (RGB), indexed by the values of :func:`chart_indices`: white, black, then the bars'.
CHART_PALETTE = ((255, 255, 255), (0, 0, 0), (215, 215, 215), (50, 110, 200), (230, 140, 40), (60, 160, 80))
_WHITE, _BLACK, _DENSE, _AC, _MAC, _RATE = range(len(CHART_PALETTE))
_ROW = 12  # pixels per line of text and per layer
OPS_AXIS = "synaptic operations per sample"
RATE_AXIS = "firing rate (spikes per neuron-step)"


def _glyph(ch: str):
    """The ink of one character (bool ``[_ROW, advance]``), rendered once."""
    g = _GLYPHS.get(ch)
    if g is None:
        import numpy as np
        from PIL import Image, ImageDraw, ImageFont

        font = ImageFont.load_default()
        advance = max(1, round(font.getlength(ch)))
        img = Image.new("L", (advance + 4, _ROW), 255)
        ImageDraw.Draw(img).text((0, -1), ch, fill=0, font=font)
        # anti-aliased grey levels as ink: black or white, two palette entries
        g = _GLYPHS[ch] = (np.asarray(img) < 192)[:, :advance]
    return g


def _text(img, x: int, y: int, text: str, align: str = "left") -> None:
    """Write ``text`` into the index image ``img`` at ``(x, y)`` (its left end, or its right end for ``right``),
    clipped to the image."""
    import numpy as np

    if not text:
        return
    ink = np.concatenate([_glyph(ch) for ch in text], axis=1)
    if align == "right":
        x -= ink.shape[1]
    x0, x1 = max(x, 0), min(x + ink.shape[1], img.shape[1])
    y1 = min(y + _ROW, img.shape[0])
    if x1 <= x0 or y1 <= y:
        return
    region = img[y:y1, x0:x1]
    region[ink[: y1 - y, x0 - x: x1 - x]] = _BLACK


def _nice(value: float) -> float:
    """The axis end for a largest value: the next of 1, 2, 2.5, 5 times a power of ten (1.0 for nothing)."""
    if not value > 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if value <= m * power * (1 + 1e-9))


def _layout(width: int, rows: int, kinds: set[str]) -> dict[str, Any]:
    label = min(170, width // 3)
    value = min(110, width // 4)
    top = 3 * _ROW + 4  # title, legend, column heads
    axes = [k for k in ("connection", "spiking") if k in kinds]
    span = max(1, width - label - value - 12)
    step = 2 * _ROW + 8  # an axis: its line and ticks, the tick values, its name
    return {"label": label, "start": label + 4, "span": span, "value_x": width - 4, "top": top,
            "ticks": 5 if span >= 250 else 2,  # intervals per axis, as many as their values fit
            "axes": {k: top + rows * _ROW + 2 + step * i for i, k in enumerate(axes)},
            "height": top + rows * _ROW + 2 + step * len(axes)}


def _base(layers: list[dict[str, Any]], width: int):
    """What depends only on the layers' names and kinds and the width: names, legend, heads, axis lines."""
    import numpy as np

    kinds = {lay["kind"] for lay in layers}
    lay_out = _layout(width, len(layers), kinds)
    key = (tuple((lay["name"], lay["kind"]) for lay in layers), width)
    base = _CHART_BASES.get(key)
    if base is not None:
        return base, lay_out
    img = np.full((lay_out["height"], width), _WHITE, dtype=np.uint8)
    x = 4
    for colour, name in ((_AC, "effective ACs"), (_MAC, "effective MACs"), (_DENSE, "dense ops"),
                         (_RATE, "firing rate")):
        img[_ROW + 4: _ROW + 11, x: x + 7] = colour
        _text(img, x + 10, _ROW + 2, name)
        x += 10 + _glyph_width(name) + 12
    start, span, top = lay_out["start"], lay_out["span"], lay_out["top"]
    _text(img, 4, 2 * _ROW + 2, "layer (forward order)")
    _text(img, lay_out["value_x"], 2 * _ROW + 2, "value: effective / dense ops, or rate", align="right")
    for i, lay in enumerate(layers):
        _text(img, 4, top + i * _ROW, lay["name"][-(lay_out["label"] // 6):])
    img[top: top + len(layers) * _ROW, start - 1] = _BLACK  # the layers' axis
    for kind, y in lay_out["axes"].items():
        img[y, start - 1: start + span + 1] = _BLACK
        ticks = lay_out["ticks"]
        for t in range(ticks + 1):
            img[y: y + 3, start + round(span * t / ticks)] = _BLACK
        _text(img, start, y + 4 + _ROW, OPS_AXIS if kind == "connection" else RATE_AXIS)
    if len(_CHART_BASES) >= 8:
        _CHART_BASES.clear()
    _CHART_BASES[key] = img
    return img, lay_out


def _glyph_width(text: str) -> int:
    return sum(_glyph(ch).shape[1] for ch in text)


def chart_indices(report: dict[str, Any], width: int = 640):
    """The per-layer chart as palette indices (uint8 ``[H, W]`` into :data:`CHART_PALETTE`): for each connection
    layer its effective ACs (blue) and MACs (orange) over its dense operations (grey), for each spiking layer its
    firing rate (green); each row ends with its value (``effective / dense`` operations per sample, or the rate),
    and each kind has its axis (name, ticks and tick values) under the rows. The title gives the basis: samples,
    T and the batch size."""
    layers = report["layers"]
    base, lay_out = _base(layers, width)
    img = base.copy()
    start, span, top = lay_out["start"], lay_out["span"], lay_out["top"]
    basis = report.get("basis") or {}
    batch = basis.get("batch_size")
    _text(img, 4, 2, f"per layer, per sample (one input over T = {report['T']} steps); {report['samples']} samples"
                     + (f", batch {batch}" if batch else ""))
    ops_end = _nice(max([lay["Dense"] for lay in layers if lay["kind"] == "connection"] or [0.0]))
    rate_end = min(1.0, _nice(max([lay["firing_rate"] for lay in layers if lay["kind"] == "spiking"] or [0.0])))

    def bar(y: int, begin: float, length: float, colour: int) -> None:
        a, b = start + round(span * begin), start + round(span * (begin + length))
        img[y + 2: y + _ROW - 2, a:b] = colour

    for i, lay in enumerate(layers):
        y = top + i * _ROW
        if lay["kind"] == "connection":
            ac, mac = lay["Effective_ACs"] / ops_end, lay["Effective_MACs"] / ops_end
            bar(y, 0.0, lay["Dense"] / ops_end, _DENSE)
            bar(y, 0.0, ac, _AC)
            bar(y, ac, mac, _MAC)
            value = f"{_si(lay['Effective_ACs'] + lay['Effective_MACs'])} / {_si(lay['Dense'])}"
        else:
            bar(y, 0.0, lay["firing_rate"] / rate_end, _RATE)
            value = f"{lay['firing_rate']:.3f}"
        _text(img, lay_out["value_x"], y, value, align="right")
    for kind, y in lay_out["axes"].items():
        end = ops_end if kind == "connection" else rate_end
        ticks = lay_out["ticks"]
        for t in range(ticks + 1):
            v = end * t / ticks
            label = _si(v) if kind == "connection" else f"{v:.3g}"
            x = start + round(span * t / ticks)
            _text(img, x + (0 if t == 0 else 1), y + 3, label, align="right" if t == ticks else "left")
    return img


def layer_chart(report: dict[str, Any], width: int = 640):
    """The per-layer chart of :func:`chart_indices` as an RGB picture (uint8 ``[H, W, 3]``)."""
    import numpy as np

    return np.asarray(CHART_PALETTE, dtype=np.uint8)[chart_indices(report, width)]


def chart_png(report: dict[str, Any], width: int = 640) -> tuple[bytes, int, int]:
    """The per-layer chart encoded as a 4-bit palette PNG: (bytes, height, width). Written here with ``zlib``
    (rows unfiltered, two pixels a byte, fastest deflate), where PIL's PNG encoder takes several times as long
    for the same picture as 8-bit palette indices, and ``SummaryWriter.add_image`` (float conversion, RGB PNG at
    the default compression) far longer."""
    import struct
    import zlib

    import numpy as np

    idx = chart_indices(report, width)
    h, w = idx.shape
    packed = np.zeros((h, 1 + (w + 1) // 2), dtype=np.uint8)  # a filter-type byte (0: none), then the row
    packed[:, 1:1 + w // 2] = (idx[:, 0:w - w % 2:2] << 4) | idx[:, 1:w:2]
    if w % 2:
        packed[:, -1] = idx[:, -1] << 4

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 4, 3, 0, 0, 0))
           + chunk(b"PLTE", bytes(c for rgb in CHART_PALETTE for c in rgb))
           + chunk(b"IDAT", zlib.compress(packed.tobytes(), 1)) + chunk(b"IEND", b""))
    return png, h, w
