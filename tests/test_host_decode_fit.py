"""benchmarks/host_decode_fit.py: the share of a what-if host's RAM bandwidth that llama.cpp's CPU
decode reaches is the one its fitting rows give (CPU-only public rows, none in the offload
validation data), and the fit reads those rows' words. Fast: the fixtures are sparse GGUF headers."""

from __future__ import annotations

import json

from kvtuner.core.speed.speed_model import HOST_DECODE_BW_SHARE
from kvtuner.testing.scripts import load_script

fitter = load_script("benchmarks/host_decode_fit.py")
ov = load_script("benchmarks/offload_validation.py")


def test_the_constant_is_the_fitted_median(tmp_path):
    rows = json.loads(fitter.ROWS.read_text())["rows"]
    share, recs = fitter.fit(rows, tmp_path)
    used = [r for r in recs if "share" in r]
    assert len(used) >= 5 and len({r["host_cpu"] for r in used}) >= 2
    assert round(share, 2) == HOST_DECODE_BW_SHARE
    # each row used gives a share between a quarter and the whole of the RAM's achieved figure
    assert all(0.25 < r["share"] < 1.0 for r in used), [(r["id"], r["share"]) for r in used]


def test_fitting_rows_are_not_validation_rows():
    fit_sources = {r["source"].split()[0] for r in json.loads(fitter.ROWS.read_text())["rows"]}
    offload = ov.load_all_rows([ov.ROWS, ov.ROWS_MORE])
    assert not fit_sources & {r["source"].split()[0] for r in offload}


def test_rows_the_share_cannot_come_from_are_left_out_with_the_reason(tmp_path):
    base = {"id": "x", "host_cpu": "AMD Ryzen 7 6800H", "host_cores": 8, "ram_type": "DDR5", "ram_mt_s": 4800}
    base |= {"ram_channels": 2, "threads": 8, "quant": "Q4_K_M", "test": "tg128", "tps": 10.0}
    two_sockets = fitter.implied_share({**base, "host_cpu": "2x AMD EPYC 9175F", "model": "Llama-2-7B"}, tmp_path)
    assert two_sockets["skip"] == "two sockets"
    moe = fitter.implied_share({**base, "model": "Mixtral 8x7B"}, tmp_path)
    assert moe["skip"] == "a mixture of experts"
    label = fitter.implied_share({**base, "model": "LLaMA 7B (llama-bench label)", "n_params_b": 6.74}, tmp_path)
    assert "share" in label and label["host"] == "DDR5-4800x2, 8 cores"
    # two cores of the reference core (2 x 15 GB/s) never reach DDR5-4800x2: the row says nothing of the share
    slow = fitter.implied_share({**base, "model": "Llama-2-7B", "threads": 2}, tmp_path)
    assert slow["skip"] == "decode bound by the cores, not the RAM"
