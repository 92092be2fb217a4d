"""Render the Tune dialog's knee chart for the issue's case (llama-3.1-8B shape Q4_K_M, 131072
tokens, a 12 GB card, 64 GiB host, 8 threads, assumed CPU rates) to docs/tune_knee.png.

    QT_QPA_PLATFORM=offscreen python benchmarks/tune_screenshot.py [--kv-quality q8_0|q4_0] [-o FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.speed.speed_model import speed_inputs
from kvtuner.core.tune import KV_QUALITY_ORDER
from kvtuner.core.units import GiB
from kvtuner.testing.gguf_factory import write_real_shape


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv-quality", default="q8_0", choices=KV_QUALITY_ORDER)
    ap.add_argument("-o", "--output", default=str(ROOT / "docs" / "tune_knee.png"))
    args = ap.parse_args()
    from kvtuner.gui.app import make_app
    from kvtuner.gui.tune_panel import TunePanel

    app = make_app()
    model = ModelProfile.from_gguf(
        write_real_shape(Path(tempfile.mkdtemp()) / "llama-3.1-8b.gguf", "llama-3.1-8b", "Q4_K_M")
    )
    gpus = (what_if_gpu(12 * GiB),)
    host = HostSpec(total_bytes=64 * GiB, available_bytes=64 * GiB, mem_bandwidth_bytes_s=50e9)
    inputs = speed_inputs(gpus, host, measure=False, n_threads=8)
    panel = TunePanel(
        lambda: (model, PlanConfig(n_ctx=131072), gpus, host, inputs), lambda fn, done, failed: done(fn())
    )
    panel.ctx_spin.setValue(131072)
    panel.quality.setCurrentIndex(KV_QUALITY_ORDER.index(args.kv_quality))
    panel.resize(1000, 760)
    panel.show()
    panel.start()
    for _ in range(5):
        app.processEvents()
    panel.grab().save(args.output)
    print(panel.text.text())
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
