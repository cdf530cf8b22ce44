"""Synthetic face-detection images built from real face crops that ship with scikit-image: works offline
(``data=faces``, :mod:`snntrain.data.faces`).

``skimage.data.lfw_subset()`` holds 200 grey 25x25 crops from Labeled Faces in the Wild: the first 100
are faces (forehead to chin, cheek to cheek), the last 100 are non-face crops of the same photographs.
Each synthetic image is composed as

1. a background, chosen per image from ``backgrounds``:

   * ``"tiles"``: a grid of non-face crops, each randomly flipped and tinted;
   * ``"photos"``: a random crop of a photograph that ships with scikit-image or scikit-learn and shows
     no face or head (see :data:`PHOTOS`);
   * ``"textures"``: procedural smooth colour noise, linear gradients or stripes;
   * ``"flat"``: one random colour (not in the default set);

2. ``distractors_per_image`` (0-2 by default) *distractors*: non-face crops pasted like faces but
   without a box, so that "a pasted square" is not what makes a face. A few LFW non-face crops
   show parts of a face (an eye, a mouth); like the subset itself, they count as background;
   then ``clutter_per_image`` pieces of *clutter*, also without a box, the things that stand around
   faces in photographs of people: hands (a palm with four fingers and a thumb), bare arms (long
   rounded limbs), both skin-coloured like the faces, and objects (cards, chips, glasses: rounded
   rectangles and ellipses, plain, striped or textured). Their skin and surfaces are non-face crops
   coloured like faces, so skin texture and colour alone do not make a face;
3. ``faces_per_image`` faces, each a face crop with random horizontal flip and brightness/contrast
   jitter, resized to a square of side drawn log-uniformly from ``face_size`` and pasted fully inside
   the image. A placement is rejected when it would hide more than ``max_overlap`` of an earlier
   face's box; after 50 rejected tries that face is left out, so an image can have fewer faces than
   drawn (rare with the defaults).

   Faces and distractors are coloured alike, so colour does not give a face away: with probability
   ``skin_tones`` a skin tone (the grey crop times a colour with red > green > blue, of unit
   luminance, so the crop's own brightness stays), otherwise the neutral or random tint that tiles get.
   With probability ``context`` a face or distractor stands in a person: hair (an ellipse around the
   upper part of the square), a neck in the crop's colour and shoulders in a clothing colour are
   painted behind it first, only on pixels that no earlier face occupies. With probability
   ``lighting`` it is shaded by a linear ramp in a random direction (side light). With probability
   ``occlusion`` a face is then partly covered by an occluder (a coloured non-face crop: a hand, a
   scarf, an object) lying inside its box along one side, 15-40 % of the side deep; the box stays the
   whole face, as WIDER FACE annotates occluded faces;
4. the whole image: with probability ``lighting`` a linear illumination ramp (x 0.5-1.25) in a random
   direction; with probability 0.2 it turns grey; with probability ``blur`` a Gaussian blur of
   standard deviation 0.4-1.4 pixels; with probability 0.5 mild pixel noise; then it is quantised to
   uint8 RGB.

The faces' boxes are exact: ``[x, y, x + s, y + s]`` for a face of side ``s`` pasted at column ``x``,
row ``y`` (``x2``/``y2`` exclusive). Faces are opaque, and nothing is painted over a face except its
own occluder and later faces (with their occluders), so the pixels a face occupies (its ``label_map``
entries) are its box minus what those cover; the image-wide blur alone spreads a face's pixels
across its border, which does not change its box.

Image ``i`` of a split is a pure function of ``(seed, split, i)``: it is drawn from a NumPy generator
seeded with that triple, so images can be rendered lazily in any order or process. The splits also use
disjoint crops: the last ``held_out_faces`` faces and non-faces (20 of each by default) appear only in
``val`` and ``test`` (whose generators differ by the split index); ``train`` uses the rest. ``val`` is the held-out split the
detection task measures mAP on. The LFW subset has no identity labels, so the same person may appear
in both pools through different photographs. The real photographs that ``scripts/real_faces.py``
measures a detector on (insightface's group photo, scikit-image's astronaut and camera man,
matplotlib's Grace Hopper) are never used, nor any other photograph with a face or a head.

Images are RGB (``in_channels = 3``, like WIDER FACE).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UnavailableError
from ..validation import one_of
from .common import positive_int
from .detection.settings import _number, int_range

#: Number of face crops at the start of ``lfw_subset()``; the rest are non-face crops.
LFW_FACES = 100
#: Photographs used as backgrounds, all shipped with scikit-image (``skimage.data``) or scikit-learn
#: (``china``, ``flower``: ``sklearn.datasets.load_sample_image``): none shows a face or a head (the
#: astronaut, camera man, cat and coins photographs are left out on purpose; the first two, with
#: matplotlib's Grace Hopper, are the real-photograph test of ``scripts/real_faces.py``).
PHOTOS = ("coffee", "rocket", "motorcycle", "china", "flower", "hubble_deep_field", "immunohistochemistry", "brick",
          "grass", "gravel", "moon", "text")
BACKGROUND_KINDS = ("tiles", "photos", "textures", "flat")
SPLITS = ("train", "val", "test")
_PLACEMENT_TRIES = 50
_GREY = np.array([0.299, 0.587, 0.114], dtype=np.float32)
#: Hair colours (black, dark brown, brown, blond, grey) before a brightness jitter.
_HAIR = np.array([[0.06, 0.05, 0.05], [0.2, 0.13, 0.08], [0.38, 0.25, 0.14], [0.72, 0.58, 0.36], [0.6, 0.6, 0.6]],
                 dtype=np.float32)


@functools.lru_cache(maxsize=1)
def lfw_crops() -> tuple[np.ndarray, np.ndarray]:
    """The scikit-image LFW subset as float32 arrays in [0, 1]: ``(faces [100, 25, 25], non_faces [100, 25, 25])``."""
    try:
        from skimage import data
    except ImportError as err:  # pragma: no cover - scikit-image is a dependency
        raise UnavailableError("data=faces needs scikit-image (pip install scikit-image)") from err
    crops = np.asarray(data.lfw_subset(), dtype=np.float32)
    if crops.ndim != 3 or crops.shape[0] != 2 * LFW_FACES:
        raise RuntimeError(
            f"skimage.data.lfw_subset() returned shape {crops.shape}; expected ({2 * LFW_FACES}, h, w) "
            "with faces first and non-faces last"
        )
    return crops[:LFW_FACES].copy(), crops[LFW_FACES:].copy()


@functools.lru_cache(maxsize=1)
def background_photos() -> tuple[np.ndarray, ...]:
    """The :data:`PHOTOS` as uint8 RGB arrays ``[H, W, 3]`` (grey ones replicated to three channels)."""
    from skimage import data

    out = []
    for name in PHOTOS:
        if name in ("china", "flower"):
            from sklearn.datasets import load_sample_image

            img = np.asarray(load_sample_image(f"{name}.jpg"))
        elif name == "motorcycle":
            img = np.asarray(data.stereo_motorcycle()[0])
        else:
            img = np.asarray(getattr(data, name)())
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        out.append(np.ascontiguousarray(img[:, :, :3].astype(np.uint8)))
    return tuple(out)


def _resize(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear (antialiased when shrinking) resize of a float32 ``[h, w]`` or ``[h, w, c]`` array."""
    from PIL import Image

    if array.shape[0] == height and array.shape[1] == width:
        return array.astype(np.float32, copy=True)
    if array.ndim == 2:
        return np.asarray(Image.fromarray(array.astype(np.float32), mode="F").resize((width, height), Image.BILINEAR))
    return np.stack([_resize(array[:, :, c], height, width) for c in range(array.shape[2])], axis=2)


@dataclass(frozen=True)
class Composite:
    """One rendered image: ``image`` uint8 ``[S, S, 3]``, ``boxes`` float32 ``[n, 4]`` xyxy (exclusive
    ``x2``/``y2``), and ``label_map`` int16 ``[S, S]``: ``k + 1`` where face ``k`` is the visible top
    layer, 0 elsewhere."""

    image: np.ndarray
    boxes: np.ndarray
    label_map: np.ndarray


class FaceComposer:
    """Renders composite images from given face / non-face crop banks (see the module docstring).

    ``faces`` and ``non_faces`` are float arrays ``[N, h, w]`` in [0, 1]; ``photos`` uint8 ``[H, W, 3]``
    arrays (needed only when ``"photos"`` is among ``backgrounds``). :meth:`render` takes a NumPy
    generator and draws everything from it; the draws never depend on pixel values, so two banks of the
    same shape give the same layout for the same generator state.
    """

    def __init__(
        self,
        faces: np.ndarray,
        non_faces: np.ndarray,
        photos: Sequence[np.ndarray] = (),
        image_size: int = 64,
        faces_per_image: Sequence[int] = (1, 3),
        face_size: Sequence[int] = (10, 48),
        distractors_per_image: Sequence[int] = (0, 2),
        max_overlap: float = 0.25,
        backgrounds: Sequence[str] = ("tiles", "photos", "textures"),
        skin_tones: float = 0.8,
        context: float = 0.5,
        lighting: float = 0.5,
        occlusion: float = 0.25,
        blur: float = 0.3,
        clutter_per_image: Sequence[int] = (0, 0),
    ) -> None:
        self.faces = np.asarray(faces, dtype=np.float32)
        self.non_faces = np.asarray(non_faces, dtype=np.float32)
        for name, bank in (("faces", self.faces), ("non_faces", self.non_faces)):
            if bank.ndim != 3 or bank.shape[0] == 0:
                raise ValueError(f"{name} must be a non-empty array [N, h, w], got shape {bank.shape}")
        self.photos = tuple(photos)
        self.image_size = positive_int("image_size", image_size)
        if self.image_size < 8:
            raise ValueError(f"image_size={image_size!r} must be at least 8")
        self.faces_per_image = int_range("faces_per_image", faces_per_image, minimum=0)
        self.face_size = int_range("face_size", face_size, minimum=4)
        if self.face_size[1] > self.image_size:
            raise ValueError(f"face_size={list(face_size)!r} must not exceed image_size={self.image_size}")
        self.distractors_per_image = int_range("distractors_per_image", distractors_per_image, minimum=0)
        if isinstance(max_overlap, bool) or not isinstance(max_overlap, (int, float)) or not 0 <= max_overlap <= 1:
            raise ValueError(f"max_overlap={max_overlap!r} must be a number in [0, 1]")
        self.max_overlap = float(max_overlap)
        if isinstance(backgrounds, str):
            backgrounds = [backgrounds]
        self.backgrounds = tuple(backgrounds)
        bad = [b for b in self.backgrounds if b not in BACKGROUND_KINDS]
        if not self.backgrounds or bad:
            raise ValueError(
                f"backgrounds={list(self.backgrounds)!r} must be a non-empty list of {', '.join(BACKGROUND_KINDS)}"
            )
        if "photos" in self.backgrounds and not self.photos:
            raise ValueError("backgrounds include 'photos' but no photos were given")
        self.skin_tones = _number("skin_tones", skin_tones, 0.0, 1.0)
        self.context = _number("context", context, 0.0, 1.0)
        self.lighting = _number("lighting", lighting, 0.0, 1.0)
        self.occlusion = _number("occlusion", occlusion, 0.0, 1.0)
        self.blur = _number("blur", blur, 0.0, 1.0)
        self.clutter_per_image = int_range("clutter_per_image", clutter_per_image, minimum=0)

    # -- random pieces -------------------------------------------------------------------------------

    def _size(self, rng: np.random.Generator) -> int:
        lo, hi = self.face_size  # log-uniform on [lo, hi + 1), floored: small and large faces equally likely per octave
        return int(min(hi, max(lo, math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))))

    @staticmethod
    def _tint(rng: np.random.Generator) -> np.ndarray:
        if rng.random() < 0.5:
            return np.ones(3, dtype=np.float32)
        return (1.0 - rng.uniform(0.0, 0.4, 3)).astype(np.float32)

    @staticmethod
    def _skin(rng: np.random.Generator) -> np.ndarray:
        """A skin colour of unit luminance (red > green > blue): multiplies a grey crop."""
        g = rng.uniform(0.68, 0.88)
        b = g * rng.uniform(0.72, 0.92)
        tone = np.array([1.0, g, b], dtype=np.float32)
        return tone / float(tone @ _GREY)

    def _tone(self, rng: np.random.Generator) -> np.ndarray:
        """The colour of a face or distractor: a skin tone with probability ``skin_tones``, else a tint."""
        return self._skin(rng) if rng.random() < self.skin_tones else self._tint(rng)

    @staticmethod
    def _colour(rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(0.0, 1.0, 3).astype(np.float32)

    @staticmethod
    def _ramp(height: int, width: int, rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
        """A linear ramp ``[height, width, 1]`` from ``lo`` to ``hi`` in a random direction."""
        angle = rng.uniform(0.0, 2 * math.pi)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        t = xx * math.cos(angle) + yy * math.sin(angle)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        return (lo + (hi - lo) * t)[:, :, None].astype(np.float32)

    def _crop(self, bank: np.ndarray, side: int, rng: np.random.Generator, tone: np.ndarray | None = None,
              width: int | None = None) -> np.ndarray:
        """A random crop of ``bank``: flipped, jittered, resized to ``side`` x ``width`` (square by default)
        and coloured by ``tone`` (a random tint when None) -> ``[side, width, 3]``."""
        crop = bank[rng.integers(len(bank))]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        contrast, brightness = rng.uniform(0.6, 1.4), rng.uniform(-0.2, 0.2)
        tint = self._tint(rng) if tone is None else tone
        mean = float(crop.mean())
        crop = np.clip((crop - mean) * contrast + mean + brightness, 0.0, 1.0)
        crop = _resize(np.ascontiguousarray(crop, dtype=np.float32), side, side if width is None else width)
        return np.clip(crop, 0.0, 1.0)[:, :, None] * tint

    def _person(self, canvas: np.ndarray, x: int, y: int, side: int, tone: np.ndarray, free: np.ndarray,
                rng: np.random.Generator) -> None:
        """Paint hair, neck and shoulders around the square at ``(x, y)`` of ``side`` (where ``free``)."""
        s = self.image_size
        hair = _HAIR[rng.integers(len(_HAIR))] * rng.uniform(0.7, 1.15)
        cx, cy = x + side / 2, y + side * rng.uniform(0.3, 0.45)
        ax, ay = side * rng.uniform(0.55, 0.75), side * rng.uniform(0.6, 0.8)
        neck = np.clip(tone * rng.uniform(0.35, 0.6), 0.0, 1.0)
        clothes = self._colour(rng) * rng.uniform(0.3, 1.0)
        top = y + side * rng.uniform(1.1, 1.35)
        half = side * rng.uniform(0.9, 1.5)
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) + 0.5
        paint = [
            (((xx - cx) / ax) ** 2 + ((yy - cy) / ay) ** 2 <= 1.0, hair),
            ((np.abs(xx - cx) <= 0.22 * side) & (yy >= y + 0.5 * side) & (yy < top + 0.3 * side), neck),
            ((yy >= top) & ((((xx - cx) / half) ** 2 + ((yy - top - 0.5 * side) / (0.5 * side)) ** 2 <= 1.0)
                            | ((yy >= top + 0.5 * side) & (np.abs(xx - cx) <= half))), clothes),
        ]
        for mask, colour in paint:
            mask &= free
            canvas[mask] = colour

    def _patch(self, bank: np.ndarray, side: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A face or distractor crop of ``side``: coloured (:meth:`_tone`), shaded with probability ``lighting``."""
        tone = self._tone(rng)
        crop = self._crop(bank, side, rng, tone)
        if rng.random() < self.lighting:
            crop = crop * self._ramp(side, side, rng, rng.uniform(0.45, 0.85), 1.0)
        return crop, tone

    def _texture(self, rng: np.random.Generator, tone: np.ndarray) -> np.ndarray:
        """A canvas-sized surface ``[S, S, 3]``: a non-face crop enlarged and coloured by ``tone``, shaded
        from one side."""
        s = self.image_size
        return self._crop(self.non_faces, s, rng, tone) * self._ramp(s, s, rng, rng.uniform(0.5, 0.9), 1.0)

    @staticmethod
    def _capsule(xx: np.ndarray, yy: np.ndarray, x0: float, y0: float, x1: float, y1: float, r: float) -> np.ndarray:
        """Pixels within ``r`` of the segment from ``(x0, y0)`` to ``(x1, y1)``."""
        dx, dy = x1 - x0, y1 - y0
        t = np.clip(((xx - x0) * dx + (yy - y0) * dy) / max(dx * dx + dy * dy, 1e-6), 0.0, 1.0)
        return (xx - x0 - t * dx) ** 2 + (yy - y0 - t * dy) ** 2 <= r * r

    def _clutter(self, canvas: np.ndarray, rng: np.random.Generator) -> None:
        """Paint one piece of clutter: a hand, a bare arm or an object (see the module docstring)."""
        s = self.image_size
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) + 0.5
        size = self._size(rng) * rng.uniform(0.6, 1.2)
        cx, cy = rng.uniform(0, s, 2)
        angle = rng.uniform(0.0, 2 * math.pi)
        kind = int(rng.integers(3))
        if kind == 0:  # a hand: palm, four fingers fanning out, a thumb to one side
            rx, ry = 0.3 * size, 0.26 * size
            c, si = math.cos(angle), math.sin(angle)
            u, v = (xx - cx) * c + (yy - cy) * si, -(xx - cx) * si + (yy - cy) * c
            mask = (u / rx) ** 2 + (v / ry) ** 2 <= 1.0
            spread = rng.uniform(0.15, 0.45)
            for k in range(4):
                a = angle + (k - 1.5) * spread / 1.5
                length = size * rng.uniform(0.35, 0.5)
                x0, y0 = cx + 0.8 * rx * math.cos(a), cy + 0.8 * rx * math.sin(a)
                mask |= self._capsule(xx, yy, x0, y0, x0 + length * math.cos(a), y0 + length * math.sin(a),
                                      0.06 * size + 0.5)
            a = angle + rng.choice([-1.0, 1.0]) * rng.uniform(1.0, 1.6)
            x0, y0 = cx + 0.7 * ry * math.cos(a), cy + 0.7 * ry * math.sin(a)
            length = size * rng.uniform(0.25, 0.35)
            mask |= self._capsule(xx, yy, x0, y0, x0 + length * math.cos(a), y0 + length * math.sin(a),
                                  0.07 * size + 0.5)
            surface = self._texture(rng, self._tone(rng))
        elif kind == 1:  # a bare arm
            length = size * rng.uniform(1.5, 3.0)
            mask = self._capsule(xx, yy, cx, cy, cx + length * math.cos(angle), cy + length * math.sin(angle),
                                 size * rng.uniform(0.12, 0.22) + 0.5)
            surface = self._texture(rng, self._tone(rng))
        else:  # an object: a rounded rectangle (card, book) or an ellipse (chip, glass, plate)
            w, h = size * rng.uniform(0.4, 1.2), size * rng.uniform(0.4, 1.2)
            c, si = math.cos(angle), math.sin(angle)
            u, v = np.abs((xx - cx) * c + (yy - cy) * si), np.abs(-(xx - cx) * si + (yy - cy) * c)
            if rng.random() < 0.5:
                r = min(w, h) * 0.15
                mask = ((u <= w / 2) & (v <= h / 2 - r)) | ((u <= w / 2 - r) & (v <= h / 2))
                mask |= (u - (w / 2 - r)) ** 2 + (v - (h / 2 - r)) ** 2 <= r * r
            else:
                mask = (u / (w / 2)) ** 2 + (v / (h / 2)) ** 2 <= 1.0
            style = int(rng.integers(3))
            if style == 0:  # plain
                surface = np.broadcast_to(self._colour(rng), (s, s, 3)).copy()
            elif style == 1:  # stripes or rings of two colours
                freq = rng.uniform(0.1, 0.4)
                t = np.sin((u if rng.random() < 0.5 else np.hypot(u, v)) * freq * 2 * math.pi) > 0
                c0, c1 = self._colour(rng), self._colour(rng)
                surface = np.where(t[:, :, None], c0, c1)
            else:  # a printed face-free pattern: a tinted non-face crop
                surface = self._texture(rng, self._tint(rng))
        canvas[mask] = surface[mask]

    def _background(self, rng: np.random.Generator) -> np.ndarray:
        s = self.image_size
        kind = self.backgrounds[rng.integers(len(self.backgrounds))]
        if kind == "flat":
            return np.broadcast_to(self._colour(rng), (s, s, 3)).copy()
        if kind == "tiles":
            tile = int(rng.integers(max(4, s // 4), max(5, s // 2 + 1)))
            n = s // tile + 2
            grid = np.zeros((n * tile, n * tile, 3), dtype=np.float32)
            for r in range(n):
                for c in range(n):
                    piece = self._crop(self.non_faces, tile, rng)
                    if rng.random() < 0.5:
                        piece = piece[::-1]
                    grid[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile] = piece
            oy, ox = rng.integers(0, tile, 2)
            return grid[oy:oy + s, ox:ox + s].copy()
        if kind == "photos":
            photo = self.photos[rng.integers(len(self.photos))]
            h, w = photo.shape[:2]
            short = min(h, w)
            side = int(round(math.exp(rng.uniform(math.log(min(short, s // 2)), math.log(short)))))
            side = max(1, min(side, short))
            y0, x0 = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            region = photo[y0:y0 + side, x0:x0 + side].astype(np.float32) / 255.0
            if rng.random() < 0.5:
                region = region[:, ::-1]
            return _resize(np.ascontiguousarray(region), s, s)
        # procedural textures
        sub = rng.integers(3)
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
        if sub == 0:  # smooth colour noise
            g = int(rng.integers(2, 9))
            img = _resize(rng.uniform(0.0, 1.0, (g, g, 3)).astype(np.float32), s, s)
        else:
            angle = rng.uniform(0.0, math.pi)
            t = xx * math.cos(angle) + yy * math.sin(angle)
            if sub == 1:  # linear gradient
                t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
            else:  # stripes, smooth or hard
                freq, phase = rng.uniform(2.0, 10.0), rng.uniform(0.0, 2 * math.pi)
                t = 0.5 + 0.5 * np.sin(2 * math.pi * freq * t + phase)
                if rng.random() < 0.5:
                    t = (t > 0.5).astype(np.float32)
            c0, c1 = self._colour(rng), self._colour(rng)
            img = c0 + (c1 - c0) * t[:, :, None]
        img = img + rng.normal(0.0, rng.uniform(0.0, 0.05), (s, s, 3))
        return np.clip(img, 0.0, 1.0).astype(np.float32)

    # -- composition ---------------------------------------------------------------------------------

    def render(self, rng: np.random.Generator) -> Composite:
        """Draw one composite image (see the module docstring for the recipe)."""
        s = self.image_size
        canvas = self._background(rng)
        label_map = np.zeros((s, s), dtype=np.int16)
        lo, hi = self.distractors_per_image
        for _ in range(int(rng.integers(lo, hi + 1))):
            side = self._size(rng)
            y, x = (int(v) for v in rng.integers(0, s - side + 1, 2))
            patch, tone = self._patch(self.non_faces, side, rng)
            if rng.random() < self.context:
                self._person(canvas, x, y, side, tone, label_map == 0, rng)
            canvas[y:y + side, x:x + side] = patch
        lo, hi = self.clutter_per_image
        for _ in range(int(rng.integers(lo, hi + 1))) if hi > 0 else ():
            self._clutter(canvas, rng)
        boxes: list[tuple[int, int, int, int]] = []
        lo, hi = self.faces_per_image
        for _ in range(int(rng.integers(lo, hi + 1))):
            for _try in range(_PLACEMENT_TRIES):
                side = self._size(rng)
                y, x = (int(v) for v in rng.integers(0, s - side + 1, 2))
                box = (x, y, x + side, y + side)
                if all(_covered(b, box) <= self.max_overlap for b in boxes):
                    break
            else:
                continue
            patch, tone = self._patch(self.faces, side, rng)
            if rng.random() < self.context:
                self._person(canvas, x, y, side, tone, label_map == 0, rng)
            canvas[y:y + side, x:x + side] = patch
            boxes.append(box)
            label_map[y:y + side, x:x + side] = len(boxes)
            if rng.random() < self.occlusion:
                self._occlude(canvas, label_map, box, rng)
        if rng.random() < self.lighting:
            canvas = canvas * self._ramp(s, s, rng, rng.uniform(0.5, 0.9), rng.uniform(1.0, 1.25))
        if rng.random() < 0.2:
            canvas = np.repeat((canvas @ _GREY)[:, :, None], 3, axis=2)
        if rng.random() < self.blur:
            from scipy.ndimage import gaussian_filter

            sigma = rng.uniform(0.4, 1.4)
            canvas = gaussian_filter(canvas, sigma=(sigma, sigma, 0.0), mode="nearest")
        if rng.random() < 0.5:
            canvas = canvas + rng.normal(0.0, rng.uniform(0.0, 0.03), canvas.shape)
        image = np.round(np.clip(canvas, 0.0, 1.0) * 255.0).astype(np.uint8)
        box_array = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        return Composite(image=image, boxes=box_array, label_map=label_map)

    def _occlude(self, canvas: np.ndarray, label_map: np.ndarray, box: tuple[int, int, int, int],
                 rng: np.random.Generator) -> None:
        """Cover a band of the face ``box`` along one side (15-40 % deep, 50-100 % long) with a coloured
        non-face crop, and clear those pixels from ``label_map``."""
        x0, y0, x1, y1 = box
        side = x1 - x0
        depth = max(1, int(round(side * rng.uniform(0.15, 0.4))))
        length = max(1, int(round(side * rng.uniform(0.5, 1.0))))
        offset = int(rng.integers(0, side - length + 1))
        edge = int(rng.integers(4))  # 0 left, 1 top, 2 right, 3 bottom
        if edge in (0, 2):
            h, w = length, depth
            top, left = y0 + offset, (x0 if edge == 0 else x1 - depth)
        else:
            h, w = depth, length
            top, left = (y0 if edge == 1 else y1 - depth), x0 + offset
        canvas[top:top + h, left:left + w] = self._crop(self.non_faces, h, rng, self._tone(rng), width=w)
        label_map[top:top + h, left:left + w] = 0


def _covered(earlier: tuple[int, int, int, int], new: tuple[int, int, int, int]) -> float:
    """Fraction of box ``earlier`` that box ``new`` would cover."""
    w = min(earlier[2], new[2]) - max(earlier[0], new[0])
    h = min(earlier[3], new[3]) - max(earlier[1], new[1])
    if w <= 0 or h <= 0:
        return 0.0
    return (w * h) / ((earlier[2] - earlier[0]) * (earlier[3] - earlier[1]))


def split_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The NumPy generator that image ``index`` of ``split`` is drawn from (negative seeds wrap mod 2**64)."""
    one_of("split", split, SPLITS)
    return np.random.default_rng([int(seed) % (1 << 64), SPLITS.index(split), int(index)])
