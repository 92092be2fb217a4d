"""benchmarks/offload_validation.py: its loader reads the public offload rows, and every row maps
to a fixture shape of kvtuner/testing/gguf_families.py / gguf_factory.py or to a stated skip reason;
two rows are predicted end to end (a partial -ngl row and an --n-cpu-moe row). Fast: the fixtures
are sparse GGUF headers."""

from __future__ import annotations

import json

import pytest

from kvtuner.testing.scripts import load_script

ov = load_script("benchmarks/offload_validation.py")

ROWS = ov.load_rows(ov.ROWS)


def test_loader_reads_every_row_with_its_split_and_regime():
    assert len(ROWS) >= 20
    for r in ROWS:
        assert r["set"] in ov.SETS and r["regime"] in ov.REGIMES, r["id"]
        assert r["source"] and r["tps"] > 0, r["id"]
    # the split: fit and validate rows exist, and no regime's fit rows share a source with its validate rows
    for regime in ov.REGIMES:
        fit = {r["source_key"] for r in ROWS if r["regime"] == regime and r["set"] == "fit"}
        val = {r["source_key"] for r in ROWS if r["regime"] == regime and r["set"] == "validate"}
        assert not fit & val, regime
    assert {r["set"] for r in ROWS} >= {"fit", "validate"}


def test_every_row_maps_to_a_fixture_shape_or_a_stated_reason():
    mapped = 0
    for r in ROWS:
        note, why = ov.classify(r)
        assert (note is None) != (why == ""), r["id"]
        if note is None:
            assert len(why) > 20, r["id"]
        else:
            mapped += 1
            assert "config.json" in note, r["id"]  # each shape names its published config
    assert mapped >= len(ROWS) // 2


def test_load_rows_rejects_a_row_without_a_measurement(tmp_path):
    p = tmp_path / "rows.json"
    p.write_text(
        '{"rows": [{"id": "x", "set": "fit", "regime": "full", "gpu": "RTX 3090", "model": "m", "test": "tg128", "tps": 0}]}'
    )
    with pytest.raises(ValueError, match="tps"):
        ov.load_rows(p)


def test_host_rules_read_the_pages_words():
    h, assumed = ov.host_of(
        {
            "host_ram": "64 GB DDR4-2400 (4 x 16 GB)",
            "host_ram_channels": 2,
            "host_cpu": "Intel Core i7-8700 (6C/12T)",
            "pcie": "3.0 x8",
        }
    )
    assert (h["memory"], h["cores"], h["pcie"]) == ("DDR4-2400x2", 6, (3, 8))
    assert assumed == ["6 threads (the CPU's physical cores)"]
    h, assumed = ov.host_of(
        {
            "host_ram": "62 GB (DDR4, quad-channel; 'measured ~102 GB/s quad-channel DDR4')",
            "host_cpu": "i9-10900X (10C/20T)",
            "host_threads": 10,
        }
    )
    assert (h["memory"], h["bw_gbs"], h["cores"]) == (None, 102.0, 10)
    h, assumed = ov.host_of({"host_ram": None, "host_cpu": "AMD Ryzen 5 7600X (6C/12T)"})
    assert h["memory"] == "DDR5-5200x2" and "RAM not stated: the CPU's rated DDR5-5200" in assumed
    with pytest.raises(ValueError, match="RAM is not stated"):
        ov.host_of({"host_ram": "lots", "host_cpu": "some CPU (4C/8T)"})


def test_two_rows_are_predicted(tmp_path):
    rows = [{**r} for r in ROWS if r["id"] in ("iv-5060ti-qwen25c14b-ngl16", "lf-2080-gptoss20b-ncmoe12")]
    out = ov.run_rows(rows, tmp_path)
    assert len(out) == 2
    for r in out:
        assert "pred" in r, r.get("skip")
        assert 0.2 < r["pred"] / r["tps"] < 5, (r["id"], r["pred"], r["tps"])


def test_the_second_rows_file_holds_validation_rows_with_ids_of_their_own(tmp_path):
    more = ov.load_all_rows([ov.ROWS, ov.ROWS_MORE])
    assert len(more) > len(ROWS)
    assert {r["set"] for r in more[len(ROWS) :]} <= {"validate", "reference"}
    row = {"id": "x", "set": "fit", "regime": "full", "gpu": "RTX 3090", "model": "m", "test": "tg128", "tps": 1.0}
    (tmp_path / "a.json").write_text(json.dumps({"rows": [row]}))
    with pytest.raises(ValueError, match="two rows files"):
        ov.load_all_rows([tmp_path / "a.json", tmp_path / "a.json"])
    (tmp_path / ov.ROWS_MORE.name).write_text(json.dumps({"rows": [row]}))
    with pytest.raises(ValueError, match="validation rows only"):
        ov.load_all_rows([tmp_path / ov.ROWS_MORE.name])


def test_host_rules_read_a_worded_link_and_cores_from_the_notes():
    h, assumed = ov.host_of(
        {
            "host_ram": "32 GB LPDDR5-6400",
            "host_cpu": "Intel Core i7-1360P (laptop)",
            "pcie": "PCIe 3.0 x4 via Thunderbolt eGPU enclosure",
            "notes": "4P+8E cores/16 threads per Intel spec, not on the page",
        }
    )
    assert (h["memory"], h["cores"], h["pcie"]) == ("LPDDR5-6400x2", 4, (3, 4))
    assert "4 threads (the CPU's physical performance cores)" in assumed
    h, assumed = ov.host_of({"host_ram": "64 GB DDR5", "host_cpu": "Intel Core Ultra 9 285K (8P+16E)"})
    assert h["memory"] == "DDR5-6400x2" and "RAM speed not stated: the CPU's rated DDR5-6400" in assumed


def test_rows_kvtuner_cannot_price_are_skipped_with_the_reason(tmp_path):
    by_id = {r["id"]: r for r in ov.load_all_rows([ov.ROWS, ov.ROWS_MORE])}
    # experts on the CPU without -ncmoe/--cpu-moe/-ot: the placement is unknown
    unplaced = {**by_id["lf-2080-gptoss20b-ncmoe12"], "id": "unplaced", "n_cpu_moe": None}
    # all of gpt-oss-120b's experts on a 24 GB card: kvtuner's answer is "does not fit", not a speed
    too_big = {**by_id["hc-3090-120b-ncmoe27-pp85"], "id": "too-big", "n_cpu_moe": 0, "regime": "full"}
    out = {r["id"]: r for r in ov.run_rows([unplaced, too_big], tmp_path)}
    assert out["unplaced"]["skip"].startswith("experts on the CPU, but the page does not say which")
    assert out["too-big"]["skip"].startswith("kvtuner: does not fit (")


def test_a_bandwidth_the_page_does_not_call_measured_is_theoretical():
    h, assumed = ov.host_of({"host_ram": "32GB DDR5, ~96 GB/s bandwidth", "host_cpu": "Ryzen 7 9700X (8C/16T)"})
    assert h["bw_gbs"] == pytest.approx(96 * 0.72)
    assert "96 GB/s not called measured: theoretical, x 0.72 (DDR5)" in assumed
    h, _ = ov.host_of({"host_ram": "DDR4, quad-channel; 'measured ~102 GB/s'", "host_cpu": "i9-10900X (10C/20T)"})
    assert h["bw_gbs"] == 102.0


def test_leave_one_source_out_names_the_sources_a_verdict_hangs_on(capsys):
    """Five prefill rows of source a (10% off) and three of b (50% off): the median is 10%, 50% with
    a left out (a flip, marked), 10% without b; a regime with fewer than five rows is not listed."""

    def rec(src, err, phase="prefill", regime="experts_cpu"):
        return {
            "pred": 100.0 * (1 + err),
            "tps": 100.0,
            "set": "validate",
            "source_key": src,
            "phase": phase,
            "regime": regime,
        }

    recs = [rec("a", 0.1)] * 5 + [rec("b", 0.5)] * 3 + [rec("c", 0.2, "decode")] * 4
    ((regime, phase, n, med, without),) = ov.leave_one_source_out(recs)
    assert (regime, phase, n) == ("experts_cpu", "prefill", 8) and med == pytest.approx(0.1)
    assert without == [("a", 3, pytest.approx(0.5)), ("b", 5, pytest.approx(0.1))]
    ov.print_leave_one_source_out(recs, markdown=False)
    assert "a 50.0% (3) *; b 10.0% (5)" in capsys.readouterr().out


def test_a_row_command_without_mmap_plans_pinned_host_weights():
    """A row whose command says ``-mmp 0`` / ``--no-mmap`` carries ``use_mmap: false`` and is
    planned so; a row that does not say (null or absent) runs the tools' default, a memory-mapped
    model."""
    rows = {r["id"]: r for r in ov.load_all_rows([ov.ROWS, ov.ROWS_MORE])}
    assert "-mmp 0" in rows["ck-4070-gptoss120b-ot31-f16-pp512"]["tool"]
    assert ov.config_of(rows["ck-4070-gptoss120b-ot31-f16-pp512"], "prefill", 512, 0).use_mmap is False
    assert "use_mmap" not in rows["hc-3090-120b-ncmoe27-pp500"]
    assert ov.config_of(rows["hc-3090-120b-ncmoe27-pp500"], "prefill", 500, 0).use_mmap is True
    for r in rows.values():  # false, unknown, or true only where the page says the mapping is on
        assert r.get("use_mmap") in (None, False) or "mmap on" in r["notes"]


def test_the_fitting_scripts_print_the_constants_the_model_uses(capsys):
    """``h2d_fit.py`` fits the pageable copy share and ``routing_fit.py`` prints gpt-oss's measured
    expert shares from their own public rows (no offload validation row): the model's constants."""
    from kvtuner.core.speed.speed_model import SpeedConstants
    from kvtuner.core.speed.weights import GPT_OSS_ROUTED_SHARE

    assert load_script("benchmarks/h2d_fit.py").main([]) == 0
    assert f"median over 12 PCIe systems: {SpeedConstants().pageable_h2d_share:.2f}" in capsys.readouterr().out
    routing = load_script("benchmarks/routing_fit.py")
    assert routing.main([]) == 0
    assert routing.shares(json.loads(routing.ROWS.read_text())) == GPT_OSS_ROUTED_SHARE


@pytest.mark.slow
def test_the_likely_ranges_the_model_uses_are_the_validation_rows(tmp_path):
    """REGIME_RANGE_LOG is what the script computes from every validation row (about 6 s of sparse
    fixtures), and kvtuner's own regime of each row's plan is the regime the row was collected
    under; a row of layers in RAM run with -nkvo, filed under kv_ram, counts as layers in RAM."""
    from kvtuner.core.speed.regime import REGIME_RANGE_LOG

    rows = [r for r in ov.load_all_rows([ov.ROWS, ov.ROWS_MORE]) if r["set"] == "validate"]
    recs = [r for r in ov.run_rows(rows, tmp_path) if "pred" in r]
    assert len(recs) > 150
    ranges = ov.likely_ranges(recs)
    assert ov.range_log_literal(ranges) == REGIME_RANGE_LOG
    assert ranges["kv_ram"]["decode"][1] is None  # 3 rows: too few for a range of its own
    for r in recs:
        if r["regime"] == "long_depth":
            continue
        if r["regime"] == "kv_ram" and r.get("ngl") is not None and r["placement"] == "partial_ngl":
            continue
        assert r["placement"] == r["regime"], r["id"]


def test_the_ranges_print_for_a_rows_file_of_one_phase(capsys):
    recs = [
        {
            "pred": 10.0,
            "tps": 9.0,
            "set": "validate",
            "regime": "experts_cpu",
            "placement": "experts_cpu",
            "phase": "decode",
        }
    ] * 6
    ov.print_likely_ranges(recs, markdown=True)
    out = capsys.readouterr().out
    assert "experts_cpu  decode 0.90-0.90x (6 rows)" in out and "| experts_cpu | 0.90-0.90x (6 rows) | - |" in out
