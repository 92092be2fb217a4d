"""One configuration shown and another run (the window's first finding), driven end to end through the real window with keys only (QTest at the
top level: key events go through Qt's shortcut map and focus handling as a person's would).

    what-if 16 GB card (Alt+N, arrow keys) -> KV layers on GPU 5 (Alt+K, type 5, Enter)
    -> "Plan for" CPU only (Alt+N, End) -> Export (Ctrl+E) -> Run (Ctrl+R)

and checks that the KV box reads n/a, nothing refuses, the prediction replanned, and Export and
Run take exactly the configuration shown. Under an X server (``DISPLAY`` set and Qt's xcb
plugin loadable: ``kvtuner.gui.platform_check``) it runs on it, e.g. ``xvfb-run``; otherwise
offscreen. Prints one line per check and exits 1 when one fails.

    PYTHONPATH=. .venv/bin/python benchmarks/gui_finding1.py            # offscreen or $DISPLAY
    PYTHONPATH=. xvfb-run -a .venv/bin/python benchmarks/gui_finding1.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from kvtuner.gui.platform_check import platform_problem, uses_xcb

if not os.environ.get("QT_QPA_PLATFORM"):
    os.environ["QT_QPA_PLATFORM"] = "xcb" if (uses_xcb() and not platform_problem()) else "offscreen"


def main() -> int:
    from PySide6 import QtCore, QtWidgets
    from PySide6.QtTest import QTest

    from kvtuner.core.export import export
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.gui.app import make_app
    from kvtuner.gui.main_window import MainWindow
    from kvtuner.gui.run_controller import BenchSettings

    Key, Mod = QtCore.Qt.Key, QtCore.Qt.KeyboardModifier
    failures: list[str] = []

    def check(name: str, ok: bool, detail: object = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail != "" else ""))
        if not ok:
            failures.append(name)

    def wait(cond, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            QtWidgets.QApplication.processEvents()
            if cond():
                return True
            time.sleep(0.02)
        return cond()

    def key(k, mod=Mod.NoModifier) -> None:
        QTest.keyClick(QtWidgets.QApplication.focusWidget() or w, k, mod)
        QtWidgets.QApplication.processEvents()

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("KVTUNER_CONFIG_DIR", tmp)
        os.environ.setdefault("KVTUNER_DATA_DIR", tmp)
        app = make_app()
        settings = QtCore.QSettings(str(Path(tmp) / "kvtuner.ini"), QtCore.QSettings.Format.IniFormat)
        w = MainWindow(
            PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64),
            settings=settings,
            bench=BenchSettings(n_prompt=32, n_gen=8, repetitions=1),
        )
        w.run_events.quiet_max_other_cores = float("inf")  # about what runs, not how fast
        w.resize(1280, 720)
        w.show()
        w.activateWindow()
        w.open_model(None)
        check("the default model opens", wait(lambda: w.model is not None and w.assessment is not None, 60))
        print(f"platform: {app.platformName()}")

        # "Plan for" a what-if 16 GB card: Alt+N focuses the list; arrows move through it
        key(Key.Key_N, Mod.AltModifier)
        check("Alt+N focuses Plan for", QtWidgets.QApplication.focusWidget() is w.hardware.choice)
        key(Key.Key_Home)
        for _ in range(w.hardware.choice.count()):
            if w.hardware.current_choice() == "16 GB":
                break
            key(Key.Key_Down)
        check("planning for the what-if 16 GB card", w.hardware.current_choice() == "16 GB")
        # KV layers on GPU 5: Alt+K focuses the number box, type the value
        key(Key.Key_K, Mod.AltModifier)
        check("Alt+K focuses the KV number box", QtWidgets.QApplication.focusWidget() is w.controls.kv.spin)
        w.controls.kv.spin.selectAll()
        QTest.keyClicks(w.controls.kv.spin, "5")
        key(Key.Key_Return)
        check("KV layers on GPU 5 is planned", w.config.kv_gpu_layers == 5, w.config.kv_gpu_layers)
        gpu_speed = w.speed.decode_tok_s

        # "Plan for" CPU only (the last entry)
        key(Key.Key_N, Mod.AltModifier)
        key(Key.Key_End)
        check("planning for CPU only", w.hardware.current_choice() == "cpu")
        check(
            "the KV box reads n/a",
            w.controls.kv.spin.text() == "n/a" and not w.controls.kv.isEnabled(),
            w.controls.kv.spin.text(),
        )
        check("nothing refused", not w.stale and w.controls.error_label.isHidden(), w.controls.error_label.text())
        check("the plan is the configuration shown", w.plan.config == w.config == w.session.config)
        check("KV 5 is not used", w.config.kv_gpu_layers is None and w.config.n_gpu_layers == 0, w.config)
        check(
            "the prediction replanned",
            w.speed.decode_tok_s != gpu_speed,
            f"{gpu_speed:.1f} -> {w.speed.decode_tok_s:.1f} tok/s",
        )

        # Export (Ctrl+E from the number box that had focus)
        w.controls.ctx.spin.setFocus()
        before = set(w.findChildren(QtWidgets.QDialog))
        key(Key.Key_E, Mod.ControlModifier)
        dialogs = [d for d in w.findChildren(QtWidgets.QDialog) if d not in before and d.isVisible()]
        check("Ctrl+E opens Export", bool(dialogs))
        if dialogs:
            dlg = dialogs[0]
            dlg.target.setCurrentText("llama-server")
            want = export("llama-server", w.model_path, w.config, model=w.model).text
            check(
                "Export writes the configuration shown",
                dlg.result is not None and dlg.result.text == want and "-ot" not in want and "-ngl 0" in want,
            )
            dlg.close()

        # Run (Ctrl+R), back in the main window
        w.activateWindow()
        wait(lambda: QtWidgets.QApplication.activeWindow() is w, 5)
        w.controls.ctx.spin.setFocus()
        wait(lambda: QtWidgets.QApplication.focusWidget() is w.controls.ctx.spin, 5)
        print(
            f"focus: {type(QtWidgets.QApplication.focusWidget()).__name__}, active window: "
            f"{type(QtWidgets.QApplication.activeWindow()).__name__}"
        )
        key(Key.Key_R, Mod.ControlModifier)
        check("Ctrl+R starts a run", wait(lambda: w.runner.running or w.last_run is not None, 10))
        check("the run completes", wait(lambda: not w.runner.running and w.last_run is not None, 300), w.last_error)
        check("Run took the configuration shown", w.last_run is not None and w.last_run[1] == w.config)
        check("no false KV-type alarm", not any("Requested a" in a.message for a in w.advice))
        w.shutdown()
    print("finding 1: " + ("reproduced fixed, every check passed" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
