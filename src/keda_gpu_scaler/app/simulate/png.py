"""A figure as a PNG: a small rasterizer (square pens, a 5 × 7 bitmap font with lower and
upper case) and a zlib writer, drawn at twice the figure's size so that text is legible.

No imaging library: the figure is lines, boxes and short labels, and the PNG format needs only
zlib and CRC-32, both in the standard library.
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib

from keda_gpu_scaler.app.simulate.chart import Box, Figure, Label, Line

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_DASH = (6.0, 4.0)
_GLYPHS_TEXT = {
    "A": ".###.|#...#|#...#|#####|#...#|#...#|#...#",
    "B": "####.|#...#|#...#|####.|#...#|#...#|####.",
    "C": ".###.|#...#|#....|#....|#....|#...#|.###.",
    "D": "###..|#..#.|#...#|#...#|#...#|#..#.|###..",
    "E": "#####|#....|#....|####.|#....|#....|#####",
    "F": "#####|#....|#....|####.|#....|#....|#....",
    "G": ".###.|#...#|#....|#.###|#...#|#...#|.####",
    "H": "#...#|#...#|#...#|#####|#...#|#...#|#...#",
    "I": ".###.|..#..|..#..|..#..|..#..|..#..|.###.",
    "J": "..###|...#.|...#.|...#.|...#.|#..#.|.##..",
    "K": "#...#|#..#.|#.#..|##...|#.#..|#..#.|#...#",
    "L": "#....|#....|#....|#....|#....|#....|#####",
    "M": "#...#|##.##|#.#.#|#.#.#|#...#|#...#|#...#",
    "N": "#...#|#...#|##..#|#.#.#|#..##|#...#|#...#",
    "O": ".###.|#...#|#...#|#...#|#...#|#...#|.###.",
    "P": "####.|#...#|#...#|####.|#....|#....|#....",
    "Q": ".###.|#...#|#...#|#...#|#.#.#|#..#.|.##.#",
    "R": "####.|#...#|#...#|####.|#.#..|#..#.|#...#",
    "S": ".####|#....|#....|.###.|....#|....#|####.",
    "T": "#####|..#..|..#..|..#..|..#..|..#..|..#..",
    "U": "#...#|#...#|#...#|#...#|#...#|#...#|.###.",
    "V": "#...#|#...#|#...#|#...#|#...#|.#.#.|..#..",
    "W": "#...#|#...#|#...#|#.#.#|#.#.#|#.#.#|.#.#.",
    "X": "#...#|#...#|.#.#.|..#..|.#.#.|#...#|#...#",
    "Y": "#...#|#...#|.#.#.|..#..|..#..|..#..|..#..",
    "Z": "#####|....#|...#.|..#..|.#...|#....|#####",
    "0": ".###.|#...#|#..##|#.#.#|##..#|#...#|.###.",
    "1": "..#..|.##..|..#..|..#..|..#..|..#..|.###.",
    "2": ".###.|#...#|....#|...#.|..#..|.#...|#####",
    "3": "#####|...#.|..#..|...#.|....#|#...#|.###.",
    "4": "...#.|..##.|.#.#.|#..#.|#####|...#.|...#.",
    "5": "#####|#....|####.|....#|....#|#...#|.###.",
    "6": "..##.|.#...|#....|####.|#...#|#...#|.###.",
    "7": "#####|....#|...#.|..#..|.#...|.#...|.#...",
    "8": ".###.|#...#|#...#|.###.|#...#|#...#|.###.",
    "9": ".###.|#...#|#...#|.####|....#|...#.|.##..",
    " ": ".....|.....|.....|.....|.....|.....|.....",
    ".": ".....|.....|.....|.....|.....|.##..|.##..",
    ",": ".....|.....|.....|.....|.##..|..#..|.#...",
    ":": ".....|.##..|.##..|.....|.##..|.##..|.....",
    "-": ".....|.....|.....|#####|.....|.....|.....",
    "_": ".....|.....|.....|.....|.....|.....|#####",
    "(": "...#.|..#..|.#...|.#...|.#...|..#..|...#.",
    ")": ".#...|..#..|...#.|...#.|...#.|..#..|.#...",
    "/": ".....|....#|...#.|..#..|.#...|#....|.....",
    "%": "##...|##..#|...#.|..#..|.#...|#..##|...##",
    "=": ".....|.....|#####|.....|#####|.....|.....",
    "+": ".....|..#..|..#..|#####|..#..|..#..|.....",
    ">": ".#...|..#..|...#.|....#|...#.|..#..|.#...",
    "<": "...#.|..#..|.#...|#....|.#...|..#..|...#.",
    "*": ".....|..#..|#.#.#|.###.|#.#.#|..#..|.....",
    "?": ".###.|#...#|....#|...#.|..#..|.....|..#..",
    "a": ".....|.....|.###.|....#|.####|#...#|.####",
    "b": "#....|#....|#.##.|##..#|#...#|#...#|####.",
    "c": ".....|.....|.###.|#....|#....|#...#|.###.",
    "d": "....#|....#|.##.#|#..##|#...#|#...#|.####",
    "e": ".....|.....|.###.|#...#|#####|#....|.###.",
    "f": "..##.|.#..#|.#...|###..|.#...|.#...|.#...",
    "g": ".....|.####|#...#|#...#|.####|....#|.###.",
    "h": "#....|#....|#.##.|##..#|#...#|#...#|#...#",
    "i": "..#..|.....|.##..|..#..|..#..|..#..|.###.",
    "j": "...#.|.....|..##.|...#.|...#.|#..#.|.##..",
    "k": "#....|#....|#..#.|#.#..|##...|#.#..|#..#.",
    "l": ".##..|..#..|..#..|..#..|..#..|..#..|.###.",
    "m": ".....|.....|##.#.|#.#.#|#.#.#|#...#|#...#",
    "n": ".....|.....|#.##.|##..#|#...#|#...#|#...#",
    "o": ".....|.....|.###.|#...#|#...#|#...#|.###.",
    "p": ".....|.....|####.|#...#|####.|#....|#....",
    "q": ".....|.....|.##.#|#..##|.####|....#|....#",
    "r": ".....|.....|#.##.|##..#|#....|#....|#....",
    "s": ".....|.....|.###.|#....|.###.|....#|####.",
    "t": ".#...|.#...|###..|.#...|.#...|.#..#|..##.",
    "u": ".....|.....|#...#|#...#|#...#|#..##|.##.#",
    "v": ".....|.....|#...#|#...#|#...#|.#.#.|..#..",
    "w": ".....|.....|#...#|#...#|#.#.#|#.#.#|.#.#.",
    "x": ".....|.....|#...#|.#.#.|..#..|.#.#.|#...#",
    "y": ".....|.....|#...#|#...#|.####|....#|.###.",
    "z": ".....|.....|#####|...#.|..#..|.#...|#####",
    "[": ".###.|.#...|.#...|.#...|.#...|.#...|.###.",
    "]": ".###.|...#.|...#.|...#.|...#.|...#.|.###.",
    "×": ".....|#...#|.#.#.|..#..|.#.#.|#...#|.....",
    "'": "..#..|..#..|.....|.....|.....|.....|.....",
    '"': ".#.#.|.#.#.|.....|.....|.....|.....|.....",
    "#": ".#.#.|.#.#.|#####|.#.#.|#####|.#.#.|.#.#.",
    ";": ".....|.##..|.##..|.....|.##..|..#..|.#...",
    "!": "..#..|..#..|..#..|..#..|..#..|.....|..#..",
    "|": "..#..|..#..|..#..|..#..|..#..|..#..|..#..",
    "~": ".....|.....|.#...|#.#.#|...#.|.....|.....",
    "^": "..#..|.#.#.|#...#|.....|.....|.....|.....",
    "{": "...#.|..#..|..#..|.#...|..#..|..#..|...#.",
    "}": ".#...|..#..|..#..|...#.|..#..|..#..|.#...",
}
SCALE = 2
"""Pixels per unit of the figure."""
_GLYPHS = {
    char: tuple(tuple(c == "#" for c in row) for row in rows.split("|"))
    for char, rows in _GLYPHS_TEXT.items()
}


def _rgb(color: str) -> bytes:
    return bytes.fromhex(color.removeprefix("#"))


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def fill(self, x0: int, y0: int, x1: int, y1: int, color: bytes) -> None:
        x0, x1 = max(0, x0), min(self.width, x1)
        y0, y1 = max(0, y0), min(self.height, y1)
        if x0 >= x1:
            return
        run = color * (x1 - x0)
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start : start + len(run)] = run

    def line(self, item: Line) -> None:
        color = _rgb(item.color)
        half = max(item.width, 1.0) * SCALE / 2
        travelled = 0.0
        points = [(x * SCALE, y * SCALE) for x, y in item.points]
        dash = (_DASH[0] * SCALE, _DASH[1] * SCALE)
        for (xa, ya), (xb, yb) in itertools.pairwise(points):
            length = math.hypot(xb - xa, yb - ya)
            steps = max(1, math.ceil(length * 2))
            for k in range(steps + 1):
                along = length * k / steps
                if item.dashed and (travelled + along) % sum(dash) >= dash[0]:
                    continue
                x = xa + (xb - xa) * k / steps
                y = ya + (yb - ya) * k / steps
                self.fill(round(x - half), round(y - half), round(x + half), round(y + half), color)
            travelled += length

    def box(self, item: Box) -> None:
        x0, y0 = round(item.x * SCALE), round(item.y * SCALE)
        x1, y1 = round((item.x + item.w) * SCALE), round((item.y + item.h) * SCALE)
        if item.fill:
            self.fill(x0, y0, x1, y1, _rgb(item.fill))
        if item.stroke:
            color = _rgb(item.stroke)
            for a, b, c, d in ((x0, y0, x1 + 1, y0 + 1), (x0, y1, x1 + 1, y1 + 1)):
                self.fill(a, b, c, d, color)
            for a, b, c, d in ((x0, y0, x0 + 1, y1 + 1), (x1, y0, x1 + 1, y1 + 1)):
                self.fill(a, b, c, d, color)

    def label(self, item: Label) -> None:
        # Glyph pixels per figure pixel, in this canvas of SCALE pixels per figure pixel.
        scale = SCALE if item.size < 16 else SCALE * 2
        advance = 6 * scale
        width = len(item.text) * advance - scale
        x = item.x * SCALE - {"start": 0, "middle": width / 2, "end": width}[item.anchor]
        top = round(item.y * SCALE) - 7 * scale
        color = _rgb(item.color)
        for i, char in enumerate(item.text):
            glyph = _GLYPHS.get(char) or _GLYPHS.get(char.upper(), _GLYPHS["?"])
            left = round(x) + i * advance
            for row, bits in enumerate(glyph):
                for col, on in enumerate(bits):
                    if on:
                        px, py = left + col * scale, top + row * scale
                        self.fill(px, py, px + scale, py + scale, color)


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """8-bit RGB, no interlace, filter type 0 on every scanline."""
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


def to_png(figure: Figure) -> bytes:
    canvas = _Canvas(figure.width * SCALE, figure.height * SCALE)
    for item in figure.items:
        if isinstance(item, Line):
            canvas.line(item)
        elif isinstance(item, Box):
            canvas.box(item)
        else:
            canvas.label(item)
    return encode_png(canvas.width, canvas.height, bytes(canvas.pixels))
