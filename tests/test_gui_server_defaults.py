"""Desktop app: llama-server's defaults and the structure probe, as the CLI has them.

The context box accepts 0 ("training": the model's training context) and the parallel box -1
("auto": 4 slots with a unified KV cache), resolved like ``kvtuner plan --ctx 0 -np -1`` and said
in the status bar; leaving "auto" restores the cache layout it replaced. A model whose layer
structure kvtuner's rules do not cover is probed in the installed llama.cpp off the GUI thread,
and the plan stops saying "approximate". Offscreen Qt widgets; the probe needs llama-cpp-python.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.plan.config import PlanConfig
from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import write_model


@pytest.fixture
def window(make_window):
    """``model`` (None: the default model) planned without GPU."""
    return lambda model=None: make_window(PlanConfig(), model=model)


def test_ctx_0_is_the_training_context_and_np_auto_is_four_unified_slots(qtbot, tmp_path, window):
    w = window()
    n_ctx_train = w.model.n_ctx_train
    assert n_ctx_train > 0
    w.controls.ctx.spin.setValue(0)
    assert w.controls.ctx.spin.text() == "training"
    assert w.config.n_ctx == n_ctx_train == w.plan.n_ctx
    assert w.controls.resolved_notes == [f"ctx 0 -> {n_ctx_train} (training context)"]
    assert "training context" in w.status.currentMessage()

    assert not w.config.kv_unified
    w.controls.parallel.spin.setValue(-1)
    assert w.controls.parallel.spin.text() == "auto"
    assert (w.config.n_seq, w.config.kv_unified) == (4, True)
    assert w.plan.kv_caches[0].n_stream == 1  # one unified stream
    w.controls.ubatch.setValue(256)  # another change keeps "auto" resolved
    assert (w.config.n_seq, w.config.kv_unified, w.config.n_ubatch) == (4, True, 256)
    w.controls.parallel.spin.setValue(2)
    assert (w.config.n_seq, w.config.kv_unified) == (2, False)  # leaving auto restores split streams


@pytest.mark.llama
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_an_untested_architecture_is_probed_and_stops_being_approximate(qtbot, tmp_path, window):
    path = write_model(tmp_path / "granite-swa.gguf", F.granite_swa())
    w = window(path)
    qtbot.waitUntil(lambda: not any(x.startswith("approximate") for x in w.plan.warnings), timeout=60_000)
    assert w.model.architecture == "granite_swa"
    assert w.model.structure.source == "approximate"  # kvtuner's own rule: untested
    assert w.session.planned_model().structure.source == "probe"  # llama.cpp's, read by the probe
    assert not w.session.needs_structure_probe
