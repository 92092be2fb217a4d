"""Write the README's screenshots: the main window at 1280x720 and 1920x1080, light and dark,
each after a short real bench on the embedded default model (offscreen Qt, no display needed).

    PYTHONPATH=. python docs/make_screenshots.py [OUT_DIR]   # default: docs/

Each PNG is checked to have exactly the asked size (a window whose minimum size is larger
would be clipped on such a screen). Settings go to a temporary folder, never the user's.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

SIZES = ((1280, 720), (1920, 1080))


def main(out_dir: Path) -> int:
    from PySide6 import QtCore, QtGui

    from kvtuner.gui.app import run

    out_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("KVTUNER_CONFIG_DIR", tmp)
        os.environ.setdefault("KVTUNER_DATA_DIR", tmp)  # calibration and the library: this script's own
        for dark in (False, True):
            for w, h in SIZES:
                path = out_dir / f"screenshot-{w}x{h}-{'dark' if dark else 'light'}.png"
                settings = QtCore.QSettings(str(Path(tmp) / f"{w}x{h}{dark}.ini"), QtCore.QSettings.Format.IniFormat)
                rc = run(None, None, screenshot=str(path), run=True, settings=settings, size=(w, h), dark=dark)
                got = QtGui.QImage(str(path)).size()
                print(f"{path}: exit {rc}, {got.width()}x{got.height()}")
                if rc or (got.width(), got.height()) != (w, h):
                    status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent))
