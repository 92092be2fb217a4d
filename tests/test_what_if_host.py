"""A what-if host (``--host-mem``, ``--host-bw``, ``--host-cores``, ``--pcie``): the memory
catalogue's figures, the flags on ``kvtuner plan`` (the prediction names the host it is for), their
effect on the predicted speed, and one-line errors."""

from __future__ import annotations

import json

import pytest

from kvtuner.cli import main
from kvtuner.core.hardware.memory_catalogue import (
    EXAMPLE_CONFIGS,
    MEMORY_TYPES,
    HostMemoryError,
    parse_host_memory,
    parse_pcie_link,
)
from test_moe_offload import gpt_oss  # noqa: F401  (the gpt-oss-20b-shaped MXFP4 fixture)


@pytest.mark.parametrize(
    "text, name, theoretical_gb_s, typical_gb_s",
    [
        ("DDR4-3200x2", "DDR4-3200x2", 51.2, 51.2 * 0.88),
        ("ddr5 6000 x2", "DDR5-6000x2", 96.0, 96.0 * 0.72),
        ("DDR4-3200x4", "DDR4-3200x4", 102.4, 102.4 * 0.88),
        ("LPDDR5-6400x2", "LPDDR5-6400x2", 102.4, 102.4 * 0.75),
        ("DDR5-4800x8", "DDR5-4800x8", 307.2, 307.2 * 0.72),
    ],
)
def test_memory_catalogue_theoretical_and_typical(text, name, theoretical_gb_s, typical_gb_s):
    """Theoretical = MT/s x 8 bytes x 64-bit channels; typical = theoretical x the type's
    measured read efficiency, each type with its source."""
    m = parse_host_memory(text)
    assert m.name == name
    assert m.theoretical_bytes_s == pytest.approx(theoretical_gb_s * 1e9)
    assert m.typical_bytes_s == pytest.approx(typical_gb_s * 1e9)
    assert m.to_dict()["source"].startswith(("Guru3D", "AIDA64", "laptop"))


def test_every_memory_type_and_example_has_a_source():
    for t in MEMORY_TYPES.values():
        assert t.source and 0.5 < t.efficiency < 1.0
    for name in EXAMPLE_CONFIGS:
        assert parse_host_memory(name).name == name


@pytest.mark.parametrize(
    "text, match",
    [
        ("DDR4", "is not a memory configuration: give TYPE-MTSxCHANNELS"),
        ("SDR-133x1", "memory type SDR is not known; give one of DDR3, DDR4, DDR5"),
        ("GDDR6-14000x2", "memory type GDDR6 is not known"),
        ("DDR4-9000x2", "DDR4 runs at 1600-4800 MT/s, not 9000"),
        ("DDR5-6000x0", "give 1 to 16 64-bit channels, not 0"),
    ],
)
def test_memory_configuration_errors_say_what_to_give(text, match):
    with pytest.raises(HostMemoryError, match=match):
        parse_host_memory(text)


def test_pcie_links():
    assert parse_pcie_link("4x16") == (4, 16)
    assert parse_pcie_link("PCIe 3.0 x4") == (3, 4)
    assert parse_pcie_link("gen5x8") == (5, 8)
    for bad in ("16", "7x16", "4x3"):
        with pytest.raises(HostMemoryError):
            parse_pcie_link(bad)


def _plan(capsys, model, *argv: str) -> dict:
    assert main(["plan", str(model), "--no-probe", "--json", *argv]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def test_plan_for_a_what_if_host_names_it(gpt_oss, capsys):  # noqa: F811
    """The issue's command: RTX 3060 12GB on a 6-core DDR4-3200 dual-channel host, PCIe 4.0 x16,
    20 layers of experts on the CPU; the JSON and the text both name that host."""
    argv = [
        "--gpu",
        "RTX 3060 12GB",
        "--host-mem",
        "DDR4-3200x2",
        "--host-cores",
        "6",
        "--pcie",
        "4x16",
        "--n-cpu-moe",
        "20",
    ]
    d = _plan(capsys, gpt_oss, *argv)
    host = d["speed"]["host"]
    assert host["what_if"] and host["memory"] == "DDR4-3200x2" and host["n_cores"] == 6 and host["pcie"] == "4.0 x16"
    assert host["mem_theoretical_bytes_s"] == pytest.approx(51.2e9)
    assert host["mem_bandwidth_bytes_s"] == pytest.approx(51.2e9 * 0.88)
    assert (
        host["name"] == "what-if host: DDR4-3200x2 (51.2 GB/s theoretical, 45.1 GB/s achieved), 6 cores, PCIe 4.0 x16"
    )
    assert d["speed"]["n_threads"] == 6
    # the decode streams at llama.cpp's share of the achieved figure (HOST_DECODE_BW_SHARE, fitted on CPU rows)
    assert any(
        "decode capped at 36.5 GB/s (0.81 of 45.1 GB/s: llama.cpp's CPU decode share)" in s
        for s in d["speed"]["sources"]
    )
    assert any("PCIe 4.0 x16 (the what-if host's slot)" in s for s in d["speed"]["sources"])
    assert 1 < d["speed"]["decode_tok_s"] < 200
    assert main(["plan", str(gpt_oss), "--no-probe", *argv]) in (0, 1)
    text = capsys.readouterr().out
    assert "for what-if host: DDR4-3200x2 (51.2 GB/s theoretical, 45.1 GB/s achieved), 6 cores, PCIe 4.0 x16" in text


def test_a_unified_gpu_has_no_pcie_link(gpt_oss, capsys):  # noqa: F811
    """An APU or Apple silicon shares one memory pool with the CPU: --pcie does not apply to it
    (it gave no prediction at all: "PCIe 0.0 x0 is not a PCIe link"), and its speed sources say
    so instead of "PCIe 0.0 x0"."""
    with_slot = _plan(capsys, gpt_oss, "--gpu", "Strix Halo 128GB", "--host-mem", "DDR5-5600x2", "--pcie", "4x16")
    without = _plan(capsys, gpt_oss, "--gpu", "Strix Halo 128GB", "--host-mem", "DDR5-5600x2")
    assert with_slot["speed"]["decode_tok_s"] == without["speed"]["decode_tok_s"] > 0
    assert "one memory pool with the CPU (no PCIe link)" in with_slot["speed"]["sources"][0]
    assert all("PCIe 0.0" not in x for x in with_slot["speed"]["sources"])


def test_each_host_flag_moves_the_prediction(gpt_oss, capsys):  # noqa: F811
    """Experts on the CPU: a slower RAM (--host-bw) slows decode, a narrow eGPU link (--pcie 3x4)
    slows prefill (op offload copies the host experts to the GPU per ubatch), more cores
    (--host-cores) speed the CPU side; without host flags the prediction is this machine's."""
    base = ["--gpu", "RTX 3060 12GB", "--n-cpu-moe", "20", "--host-cores", "6"]
    mine = _plan(capsys, gpt_oss, "--gpu", "RTX 3060 12GB", "--n-cpu-moe", "20")["speed"]
    assert not mine["host"]["what_if"] and mine["host"]["name"] == "this machine"
    slow_ram = _plan(capsys, gpt_oss, *base, "--host-bw", "5")["speed"]
    fast_ram = _plan(capsys, gpt_oss, *base, "--host-bw", "60")["speed"]
    assert slow_ram["host"]["name"] == "what-if host: RAM at 5.0 GB/s achieved, 6 cores"
    assert slow_ram["host"]["mem_bandwidth_bytes_s"] == 5e9
    assert slow_ram["decode_tok_s"] < 0.6 * fast_ram["decode_tok_s"]
    egpu = _plan(capsys, gpt_oss, *base, "--host-bw", "60", "--pcie", "3x4")["speed"]
    assert egpu["host"]["pcie"] == "3.0 x4"
    assert egpu["prefill_tok_s"] < 0.5 * fast_ram["prefill_tok_s"]
    few = _plan(capsys, gpt_oss, "--gpu", "RTX 3060 12GB", "--n-cpu-moe", "20", "--host-bw", "60", "--host-cores", "2")[
        "speed"
    ]
    assert few["n_threads"] == 2 and few["decode_tok_s"] < fast_ram["decode_tok_s"]
    threads = _plan(capsys, gpt_oss, *base, "--host-bw", "60", "-t", "3")["speed"]
    assert threads["n_threads"] == 3  # -t picks the threads on the host's cores


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--host-mem", "DDR4"], "kvtuner: --host-mem: 'DDR4' is not a memory configuration: give TYPE-MTSxCHANNELS"),
        (
            ["--host-mem", "DDR4-3200x2", "--host-bw", "40"],
            "give --host-mem (a named memory configuration) or --host-bw",
        ),
        (["--host-bw", "0"], "--host-bw is GB/s of RAM bandwidth (0.5 to 10000), not 0"),
        (["--host-cores", "0"], "--host-cores must be 1 to 1024 physical cores, not 0"),
        (["--pcie", "4x3"], "kvtuner: --pcie: '4x3': a PCIe link has 1, 2, 4, 8 or 16 lanes, not 3"),
        (["bench", "--host-cores", "6"], "bench measures this machine: --host-cores describes a what-if host"),
    ],
)
def test_bad_host_flags_are_one_line_and_exit_2(argv, message, capsys):
    cmd = ["plan", "--no-probe", *argv] if argv[0] != "bench" else argv
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_what_if_host_without_a_probe_has_its_cores_of_the_reference_core():
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.speed.speed_model import REFERENCE_CORE_ATTN_DECODE_S, cpu_rate, host_rates, reference_core_rates

    # six cores stream 6 x 15 GB/s: DDR5-6000x2's typical 69.1 GB/s caps the decode; two cores do not reach it
    six = reference_core_rates(6, 69.12e9)
    assert six.decode_bytes_s["*"] == pytest.approx(69.12e9)
    assert reference_core_rates(2, 69.12e9).decode_bytes_s["*"] == pytest.approx(30e9)
    # a table-lookup type at its measured share of the cores' figure: six cores of IQ3_XXS
    # (0.44) do not reach the RAM's cap; IQ4_NL (as fast as MXFP4 or faster) does
    assert six.decode_bytes_s["IQ3_XXS"] == pytest.approx(6 * 15e9 * 0.44)
    assert six.decode_bytes_s["IQ4_NL"] == pytest.approx(69.12e9)
    assert cpu_rate(six.decode_bytes_s, "Q4_K") == pytest.approx(69.12e9)  # a streaming type: the "*" figure
    assert six.attn_decode_s == {"*": pytest.approx(REFERENCE_CORE_ATTN_DECODE_S / 6)}
    assert six.prefill_flop_s == {"*": pytest.approx(6 * 130e9)}
    host = HostSpec(total_bytes=64 << 30, what_if=True, memory="DDR5-6000x2", mem_bandwidth_bytes_s=69.12e9, n_cores=6)
    r = host_rates(host, measure=False, n_threads=6)
    assert r.cpu.decode_bytes_s["*"] == pytest.approx(0.81 * 69.12e9) and "6 reference cores" in r.source
    assert r.cpu.decode_bytes_s["IQ3_XXS"] == pytest.approx(6 * 15e9 * 0.44)  # under the 56 GB/s cap
    # share 1: the RAM's achieved figure itself; the share moves nothing but a what-if host's decode cap
    assert host_rates(host, measure=False, n_threads=6, decode_bw_share=1.0).cpu.decode_bytes_s["*"] == pytest.approx(
        69.12e9
    )
    assert r.cpu.prefill_flop_s == {"*": pytest.approx(6 * 130e9)}
    # this machine (not a what-if host) without a probe keeps the per-thread fallback
    here = host_rates(HostSpec(total_bytes=64 << 30, mem_bandwidth_bytes_s=69.12e9), measure=False, n_threads=6)
    assert here.cpu.decode_bytes_s["*"] == pytest.approx((1 + 5 * 0.55) * 5e9)
    assert here.cpu.decode_bytes_s["IQ2_XXS"] == pytest.approx((1 + 5 * 0.55) * 5e9 * 0.26)


def test_kv_rows_are_read_at_a_streaming_rate():
    """The KV cache's rows go through streaming kernels: a probe table's fastest streaming type,
    or, in a table of table-lookup types only, a lookup type's streaming equivalent (its rate over
    its measured share); type names in any case."""
    from kvtuner.core.speed.cpu_probe import ProbeError
    from kvtuner.core.speed.speed_model import cpu_rate, fallback_cpu_rates, kv_stream_rate

    assert kv_stream_rate({"Q4_K": 20e9, "IQ4_NL": 25e9, "IQ2_XXS": 5e9}) == 20e9
    assert kv_stream_rate({"IQ2_XXS": 2.6e9, "IQ3_XXS": 4.0e9}) == pytest.approx(10e9)  # 2.6 / 0.26
    assert kv_stream_rate({"iq2_xxs": 2.6e9}) == pytest.approx(10e9)
    assert kv_stream_rate({"Q4_K": 0.0, "IQ2_XXS": 2.6e9}) == pytest.approx(10e9)  # a 0 is no reading
    with pytest.raises(ProbeError):
        kv_stream_rate({"Q4_K": 0.0})
    table = fallback_cpu_rates(1, 100e9).decode_bytes_s
    assert cpu_rate(table, "iq2_xxs") == cpu_rate(table, "IQ2_XXS") == pytest.approx(5e9 * 0.26)


def test_memory_mapped_host_weights_copied_per_ubatch_are_noted(gpt_oss):  # noqa: F811
    """``mmap-host-weights``: experts in RAM are copied to the GPU for every prompt ubatch (op
    offload) from pageable memory while mmap is on; the fix turns mmap off, the figure kvtuner's
    prefill assumes. No note without mmap, below the 32-token offload batch, or with nothing in RAM."""
    import dataclasses

    from kvtuner.core.advice.advisor import advise
    from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory

    model = ModelProfile.from_gguf(gpt_oss)
    host = HostSpec(total_bytes=64 << 30, available_bytes=64 << 30, mem_bandwidth_bytes_s=45e9)

    def notes(gpu: str, **cfg: object) -> list:
        plan = plan_memory(model, PlanConfig(n_ctx=8192, **cfg), [catalogue_gpu(gpu)], host)
        return [a for a in advise(plan) if a.id == "mmap-host-weights"]

    (note,) = notes("RTX 3060 12GB", n_cpu_moe=20)
    assert note.severity == "info" and note.fix == {"use_mmap": False}
    # 20 layers' experts, 7.90 GiB, of which a 512-token ubatch routes to the pool's 0.73
    assert "copies 5.77 GiB of the weights kept in RAM to CUDA0" in note.message
    assert "about 57% of the pinned rate" in note.message
    assert "avoid using a host buffer when using mmap" in note.reason
    assert notes("RTX 3060 12GB", n_cpu_moe=20, use_mmap=False) == []
    assert notes("RTX 3060 12GB", n_cpu_moe=20, n_ubatch=16, n_batch=16) == []
    assert notes("RTX 3090") == []  # all of it in VRAM: nothing to copy
    # a plan whose fix is applied no longer carries the note
    plan = plan_memory(model, PlanConfig(n_ctx=8192, n_cpu_moe=20), [catalogue_gpu("RTX 3060 12GB")], host)
    fixed = plan_memory(model, dataclasses.replace(plan.config, **note.fix), [catalogue_gpu("RTX 3060 12GB")], host)
    assert "mmap-host-weights" not in {a.id for a in advise(fixed)}
    # the figure is the prefill workload's copied weights, a part of its PCIe bytes (kept through JSON)
    from kvtuner.core.speed.speed_model import Workload, prefill_workload

    work = prefill_workload(plan, 512, 0)
    assert 5.76 * (1 << 30) < work.weight_copy_bytes < work.pcie_bytes
    # memory-mapped: every copied weight is pageable; without mmap none is
    assert work.pageable_bytes == work.weight_copy_bytes
    assert prefill_workload(fixed, 512, 0).pageable_bytes == 0
    assert Workload.from_dict(work.to_dict()) == work
