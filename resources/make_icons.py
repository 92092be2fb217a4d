"""Render the app icon's PNG sizes from its SVG source with Qt's SVG renderer.

    PYTHONPATH=. python resources/make_icons.py        # rewrites kvtuner/resources/icons/*.png
    PYTHONPATH=. python resources/make_icons.py --check  # exit 1 if a committed PNG is stale

Source: kvtuner/resources/kvtuner.svg. Sizes: the freedesktop Icon Theme Specification's usual
hicolor sizes (16..512 px, "Directory Layout"); Qt's QSvgRenderer (PySide6-Essentials) draws
them, so nothing beyond kvtuner's own dependencies is needed. The PNGs are committed (a wheel or
bundle must not need a renderer) and this script is how they were made.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[1] / "kvtuner" / "resources"
SIZES_PX = (16, 24, 32, 48, 64, 128, 256, 512)


def render(size_px: int) -> QtGui.QImage:  # noqa: F821
    """The icon at ``size_px`` x ``size_px`` pixels, transparent outside the rounded square."""
    from PySide6 import QtCore, QtGui, QtSvg

    renderer = QtSvg.QSvgRenderer(str(RESOURCES / "kvtuner.svg"))
    if not renderer.isValid():
        raise SystemExit(f"make_icons: {RESOURCES / 'kvtuner.svg'} is not a valid SVG")
    image = QtGui.QImage(size_px, size_px, QtGui.QImage.Format.Format_ARGB32)
    image.fill(QtCore.Qt.GlobalColor.transparent)
    painter = QtGui.QPainter(image)
    painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def same_picture(a: QtGui.QImage, b: QtGui.QImage) -> bool:  # noqa: F821
    """True when both images have the same size and at most 1% of their pixels differ by more
    than 24/255 in a channel: another Qt release may antialias edges a little differently."""
    import numpy as np
    from PySide6 import QtGui

    if a.size() != b.size():
        return False
    fmt = QtGui.QImage.Format.Format_RGBA8888
    pixels = []
    for img in (a, b):
        rgba = img.convertToFormat(fmt)  # kept alive while its bits are copied
        n_bytes = rgba.width() * rgba.height() * 4  # 32-bit rows: bytesPerLine == width * 4
        pixels.append(np.frombuffer(bytes(rgba.constBits())[:n_bytes], dtype=np.uint8).reshape(-1, 4).astype(np.int16))
    differing = (np.abs(pixels[0] - pixels[1]).max(axis=1) > 24).sum()
    return bool(differing <= 0.01 * len(pixels[0]))


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) icons/kvtuner-<N>.png for every size; exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed PNGs, write nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6 import QtGui

    app = QtGui.QGuiApplication.instance() or QtGui.QGuiApplication([sys.argv[0]])  # noqa: F841
    stale = []
    for size in SIZES_PX:
        image = render(size)
        path = RESOURCES / "icons" / f"kvtuner-{size}.png"
        if args.check:
            if not path.is_file() or not same_picture(QtGui.QImage(str(path)), image):
                stale.append(path.name)
        elif not image.save(str(path), "PNG"):
            raise SystemExit(f"make_icons: could not write {path}")
    if stale:
        print(f"make_icons: stale or missing: {', '.join(stale)} (run resources/make_icons.py)", file=sys.stderr)
        return 1
    print(("checked" if args.check else "wrote") + f" {len(SIZES_PX)} icons in {RESOURCES / 'icons'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
