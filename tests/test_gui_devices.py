"""The device list: add a what-if card or an RPC host, split sliders, -sm / -mg; the
plan the window shows follows llama.cpp's split rule. Offscreen, no llama.cpp needed."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.gui.widgets.hardware_panel import DEFAULT_WHAT_IF

SCREENSHOT = os.environ.get("KVTUNER_DEVICES_SCREENSHOT", "")


@pytest.fixture
def window(make_window):
    """The default model planned for the what-if card (no GPU here: CPU only is the default)."""
    return lambda: make_window(what_if=DEFAULT_WHAT_IF, wait=lambda w: w.plan is not None and len(w.plan.gpus) == 1)


def test_device_list_cards_rpc_and_split_sliders(qtbot, tmp_path, window):
    w = window()
    panel = w.devices
    assert len(w.plan.gpus) == 1  # the Hardware panel's what-if card
    # add a second local card: two GPUs, split by their (what-if: total) memory
    panel.card.setCurrentText("RTX 3090")
    panel.add_card_button.click()
    qtbot.waitUntil(lambda: len(w.plan.gpus) == 2, timeout=10_000)
    assert [d.device for d in w.plan.gpus] == ["CUDA0", "CUDA1"]
    # -ts 75,25 by the sliders: layers 0..14 on CUDA0, 15..17 and the output on CUDA1
    panel.by_memory.setChecked(False)
    panel.sliders[0].setValue(75)
    panel.sliders[1].setValue(25)
    qtbot.waitUntil(lambda: w.plan.split is not None and w.plan.split.tensor_split == (75.0, 25.0), timeout=10_000)
    assert w.plan.layer_devices == ("CUDA0",) * 15 + ("CUDA1",) * 4
    # an RPC host (what-if size): llama.cpp puts it first, the sliders follow
    assert not panel.add_rpc("nohost")  # refused, with the reason shown
    assert "host:port" in panel.error.text() and not panel.error.isHidden()
    assert panel.add_rpc("127.0.0.1:50052=4G")
    qtbot.waitUntil(lambda: len(w.plan.gpus) == 3, timeout=10_000)
    assert [d.kind for d in w.plan.devices] == ["rpc", "gpu", "gpu", "host"]
    assert w.plan.devices[0].device == "RPC0[127.0.0.1:50052]"
    assert len(panel.sliders) == 3 and panel.list.count() == 3
    assert [sl.value() for sl in panel.sliders] == [50, 75, 25]  # each card keeps its share
    assert panel.main_gpu.text() == "0" and panel.main_gpu.maximum() == 2
    captions = [r.caption for r in w.prediction.bars.rows]
    assert any("RPC0[127.0.0.1:50052]" in c for c in captions), captions
    if SCREENSHOT:
        w.resize(1440, 960)
        qtbot.wait(200)
        assert w.grab().save(SCREENSHOT)
    # -sm none -mg 2: only the third device holds layers
    panel.mode.setCurrentIndex(panel.mode.findData("none"))
    panel.main_gpu.setValue(2)
    qtbot.waitUntil(lambda: set(w.plan.layer_devices) == {"CUDA1"}, timeout=10_000)
    # remove the RPC host again
    panel.list.setCurrentRow(0)
    panel.remove_button.click()
    qtbot.waitUntil(lambda: len(w.plan.gpus) == 2, timeout=10_000)


def test_an_added_amd_card_keeps_its_backend(qtbot, window):
    """A card added in the list stays what the catalogue says it is: an RX 7900 XTX beside the
    what-if NVIDIA card is planned as ROCm and named ROCm0 (each backend numbers from 0), and the
    advice warns that the two need CUDA and ROCm in one llama-server."""
    w = window()
    panel = w.devices
    panel.card.setCurrentText("RX 7900 XTX")
    panel.add_card_button.click()
    qtbot.waitUntil(lambda: len(w.plan.gpus) == 2, timeout=10_000)
    amd = w.plan.gpus[1]
    assert (amd.device, amd.backend, amd.backend_device) == ("CUDA1", "ROCm", "ROCm0")
    assert "ROCm0" in panel.list.item(1).text()
    # the advisor pane says no one llama.cpp build runs the NVIDIA and the AMD card together
    qtbot.waitUntil(lambda: any(a.id == "mixed-backends" for a in w.advisor.items), timeout=10_000)


def test_export_dialog_carries_the_split_and_rpc(qtbot, tmp_path, window):
    w = window()
    panel = w.devices
    assert panel.add_rpc("127.0.0.1:50052=4G")
    panel.by_memory.setChecked(False)
    panel.sliders[0].setValue(30)
    panel.sliders[1].setValue(10)
    dlg = w.open_export()
    qtbot.addWidget(dlg)
    dlg.target.setCurrentText("llama-server")
    dlg.render()
    text = dlg.preview.toPlainText()
    assert "#   rpc-server -H 127.0.0.1 -p 50052 -c" in text
    assert text.rstrip().endswith("-ts 30,10 --rpc 127.0.0.1:50052")
