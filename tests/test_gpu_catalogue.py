"""The GPU catalogue (kvtuner.core.hardware.gpu_catalogue): lookups by a user's name and by
NVML's, the what-if card it builds, NVML-derived bandwidth (stand-in NVML), and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvtuner.core.hardware import nvml
from kvtuner.core.hardware.gpu_catalogue import (
    GPU_CATALOGUE,
    UnknownGpuError,
    find_gpu,
    match_nvml_name,
    pcie_bandwidth_bytes_s,
)
from kvtuner.core.hardware.specs import catalogue_gpu
from kvtuner.core.speed.speed_model import gpu_rates
from kvtuner.core.units import GiB
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.nvml_standin import fake_nvml


@pytest.mark.parametrize(
    "text, name",
    [
        ("RTX 3090", "RTX 3090"),
        ("rtx3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("rtx-4060-ti-16gb", "RTX 4060 Ti 16GB"),
        ("5090", "RTX 5090"),
        ("P40", "Tesla P40"),
        ("tesla p40", "Tesla P40"),
        ("A100 80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("H100 SXM", "H100 SXM"),
        ("h200", "H200"),
        ("RTX 3060 12GB", "RTX 3060 12GB"),
        # exact names only: the RTX 2080 is the 8 GB card, not the RTX 2080 Ti whose name starts alike
        ("RTX 2080", "RTX 2080"),
        ("rtx 2080 ti", "RTX 2080 Ti"),
        ("RTX 4060 Laptop GPU", "RTX 4060 Laptop"),
        ("NVIDIA GeForce RTX 5070 Ti", "RTX 5070 Ti"),
        ("RTX 4070 Super", "RTX 4070 Super"),
        ("RTX 3050 8GB", "RTX 3050 8GB"),
    ],
)
def test_find_gpu(text, name):
    assert find_gpu(text).name == name


@pytest.mark.parametrize(
    "text, match",
    [
        ("RTX 30", r"not in the catalogue \(nearest: RTX 3070, RTX 3090, "),
        ("RTX 3060", "matches several catalogue entries: RTX 3060 8GB, RTX 3060 12GB; name one of them"),
        ("RTX 2090", r"not in the catalogue \(nearest: .*RTX 2080"),
        ("RTX 4060 Ti", "matches several catalogue entries: RTX 4060 Ti 8GB, RTX 4060 Ti 16GB"),
        ("Voodoo 5", "is not in the catalogue"),
        (
            "RTX PRO 6000",
            "is not a catalogue name, only the start of RTX PRO 6000 Blackwell, RTX PRO 6000 Blackwell "
            "Server Edition, RTX PRO 6000 Blackwell Max-Q: name yours exactly",
        ),
        ("rtx pro 5000", "only the start of RTX PRO 5000 Blackwell: name yours exactly"),
        ("  ", "empty GPU name"),
    ],
)
def test_find_gpu_says_what_to_change(text, match):
    with pytest.raises(UnknownGpuError, match=match):
        find_gpu(text)


def test_nvml_names_pick_the_entry_by_memory_size():
    assert match_nvml_name("NVIDIA GeForce RTX 4060 Ti", 16 * GiB).name == "RTX 4060 Ti 16GB"
    assert match_nvml_name("NVIDIA GeForce RTX 4060 Ti", 8 * GiB).name == "RTX 4060 Ti 8GB"
    assert match_nvml_name("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert match_nvml_name("NVIDIA GeForce RTX 3060 Ti").name == "RTX 3060 Ti"  # another card than the RTX 3060
    assert match_nvml_name("NVIDIA GeForce RTX 3080 Laptop GPU", 16 * GiB).name == "RTX 3080 Laptop 16GB"
    assert match_nvml_name("Some GPU") is None


def test_catalogue_figures_are_the_datasheets():
    g = GPU_CATALOGUE
    assert g["RTX 3090"].mem_bandwidth_bytes_s == 936.2e9
    assert g["RTX 3090"].fp16_tensor_flop_s == pytest.approx(142.3e12, rel=1e-3)  # GA102 whitepaper: 142 TFLOPS
    assert g["RTX 4090"].int8_op_s == pytest.approx(660.6e12, rel=1e-3)  # Ada whitepaper: 660.6 TOPS dense
    assert g["RTX 5090"].mem_bandwidth_bytes_s == 1792e9 and g["RTX 5090"].pcie_gen == 5
    assert g["H200"].vram_bytes == 141 * GiB and g["H200"].mem_bandwidth_bytes_s == 4.8e12
    assert not g["Tesla P40"].has_int8_tensor_cores and g["RTX 2080 Ti"].has_int8_tensor_cores
    assert pcie_bandwidth_bytes_s(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert g["RTX 4060 Ti 16GB"].pcie_bandwidth_bytes_s == pytest.approx(15.75e9, rel=1e-3)  # x8
    # the product pages' figures: RTX 2080 8 GB at 448 GB/s, PCIe 3.0; RTX 5060 Ti on PCIe 5.0 x8
    assert (g["RTX 2080"].vram_bytes, g["RTX 2080"].mem_bandwidth_bytes_s, g["RTX 2080"].pcie_gen) == (
        8 * GiB,
        448e9,
        3,
    )
    assert g["RTX 2080"].fp32_flop_s == pytest.approx(10.07e12, rel=1e-2)
    assert g["RTX 4070 Ti Super"].mem_bandwidth_bytes_s == 672e9 and g["RTX 4070 Ti Super"].vram_bytes == 16 * GiB
    assert g["RTX 4090 Laptop"].fp32_flop_s == pytest.approx(39.7e12, rel=1e-2)  # 9728 lanes at 2040 MHz
    assert (
        g["RTX 5080"].fp32_flop_s == pytest.approx(56.3e12, rel=1e-2) and g["RTX 5080"].mem_bandwidth_bytes_s == 960e9
    )
    assert (g["RTX 5060 Ti 16GB"].pcie_gen, g["RTX 5060 Ti 16GB"].pcie_lanes) == (5, 8)
    for series in ("20", "30", "40", "50"):  # desktop and laptop parts of every series
        names = [n for n in g if n.startswith(f"RTX {series[0]}0")]
        assert sum("Laptop" in n for n in names) >= 4 and sum("Laptop" not in n for n in names) >= 6, series
    for e in g.values():
        assert e.source and e.vram_bytes > 0 and e.mem_bandwidth_bytes_s > 0 and e.int8_op_s > 0


def test_workstation_boards_by_name_and_nvml_name():
    """RTX professional boards: their own entries (not a GeForce of a similar number), by the
    name a user types and by the name NVML reports."""
    a1000 = find_gpu("RTX A1000")
    assert (a1000.vram_bytes, a1000.mem_bandwidth_bytes_s, a1000.pcie_gen, a1000.pcie_lanes) == (8 * GiB, 192e9, 4, 8)
    assert a1000.fp16_tensor_flop_s == pytest.approx(53.8e12 / 2, rel=0.01)  # the datasheet's 53.8 is with sparsity
    assert match_nvml_name("NVIDIA RTX 4000 Ada Generation").name == "RTX 4000 Ada"
    assert match_nvml_name("NVIDIA RTX PRO 6000 Blackwell Workstation Edition").vram_bytes == 96 * GiB
    server = match_nvml_name("NVIDIA RTX PRO 6000 Blackwell Server Edition")  # the cloud's board
    assert server.name == "RTX PRO 6000 Blackwell Server Edition" and server.vram_bytes == 96 * GiB
    assert find_gpu("RTX PRO 5000 Blackwell").fp32_flop_s == pytest.approx(65e12, rel=0.01)  # NVIDIA's figure
    assert find_gpu("nvidia rtx a2000 12gb").name == "RTX A2000 12GB"
    with pytest.raises(UnknownGpuError, match="not a catalogue name, only the start of RTX 4000 SFF Ada, RTX 4000 Ada"):
        find_gpu("RTX 4000")  # the Quadro RTX 4000 (Turing) is not the RTX 4000 Ada


def test_catalogue_gpu_is_a_what_if_card_with_its_figures():
    g = catalogue_gpu("rtx 4090", index=1)
    assert (g.name, g.device, g.total_bytes, g.what_if, g.catalogue) == (
        "RTX 4090 (what-if)",
        "CUDA1",
        24 * GiB,
        True,
        "RTX 4090",
    )
    assert g.mem_bandwidth_bytes_s == 1008e9
    r = gpu_rates(g)
    assert r.int8_op_s == GPU_CATALOGUE["RTX 4090"].int8_op_s and "bandwidth of the RTX 4090" in r.source


def test_catalogue_cards_are_planned_under_their_vendors_backend(tmp_path):
    """An AMD card of the catalogue is a ROCm device and an Intel one a SYCL device, as when sysfs
    finds them; the plan and its fit verdict name the device as that backend's log does."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.plan.verdict import fit_verdict
    from kvtuner.testing.gguf_factory import ModelSpec, write_model

    assert [catalogue_gpu(n).backend for n in ("RTX 3090", "RX 7900 XTX", "Arc B580")] == ["CUDA", "ROCm", "SYCL"]
    assert catalogue_gpu("M2 Max").backend == "Metal"
    model = ModelProfile.from_gguf(write_model(tmp_path / "m.gguf", ModelSpec()))
    plan = plan_memory(model, PlanConfig(n_ctx=1024), [catalogue_gpu("RX 7900 XTX")])
    assert (plan.gpus[0].device, plan.gpus[0].backend_device) == ("CUDA0", "ROCm0")
    assert fit_verdict(plan).why.startswith("Fits: ROCm0 needs ")


def test_cli_json_names_a_rocm_card_as_rocm0():
    """``plan --json`` and ``tune --json`` keep the ``CUDA0`` slot in ``device`` and name the card
    as its backend does in ``backend_device``; the speed sources and verdicts say ``ROCm0``."""
    doc = json.loads(run_kvtuner("plan", "--gpu", "RX 7900 XTX", "--no-probe", "--json").stdout)
    gpu = doc["fit"]["devices"][0]
    assert (gpu["device"], gpu["backend_device"]) == ("CUDA0", "ROCm0")
    assert doc["fit"]["devices"][1]["backend_device"] == "CPU"
    assert doc["speed"]["sources"][0].startswith("ROCm0: bandwidth of the RX 7900 XTX")
    tune = json.loads(run_kvtuner("tune", "--gpu", "RX 7900 XTX", "--ctx", "4096", "--no-probe", "--json").stdout)
    assert [d["backend_device"] for d in tune["best"]["plan"]["devices"]] == ["ROCm0", "CPU"]
    assert tune["given_fit"]["devices"][0]["backend_device"] == "ROCm0"


def test_nvml_bandwidth_and_catalogue_entry():
    """Stand-in NVML: an RTX 3060 reporting 7501 MHz memory clock and a 192-bit bus is
    7501e6 x 2 x 192 / 8 = 360 GB/s; its name picks the catalogue entry; a card NVML cannot tell
    the bus width of has no bandwidth (the catalogue or nearest card then gives one)."""
    nvml.use_nvml_module(fake_nvml(2))
    try:
        a, b = nvml.detect_gpus()
    finally:
        nvml.use_nvml_module(None)
    assert a.mem_bandwidth_bytes_s == pytest.approx(360.048e9)
    assert a.pcie_bandwidth_bytes_s == pytest.approx(16 * 1969.2e6)
    assert a.catalogue == "RTX 3060 12GB"
    r = gpu_rates(a)
    assert r.bandwidth_bytes_s == pytest.approx(360.048e9) and "NVML" in r.source
    # RTX A2000 12GB: NVML cannot tell its bus width; the catalogue's workstation entry gives 288 GB/s
    assert b.mem_bandwidth_bytes_s is None and b.catalogue == "RTX A2000 12GB"
    assert gpu_rates(b).bandwidth_bytes_s == pytest.approx(288e9)
    unknown = replace(b, name="NVIDIA Quadro Unlisted", catalogue=None)  # a card the catalogue lacks
    rb = gpu_rates(unknown)
    assert rb.bandwidth_bytes_s == GPU_CATALOGUE["RTX 3060 12GB"].mem_bandwidth_bytes_s
    assert "nearest catalogue card" in rb.source


def test_cli_gpus_lists_the_catalogue():
    out = run_kvtuner("gpus")
    assert out.returncode == 0
    assert "RTX 3060 12GB" in out.stdout and "H200" in out.stdout and "936" in out.stdout
    doc = json.loads(run_kvtuner("gpus", "--json").stdout)
    assert {e["name"] for e in doc["catalogue"]} == set(GPU_CATALOGUE)
    assert all(e["source"] for e in doc["catalogue"])


@pytest.mark.slow
def test_cli_plan_for_a_named_card_and_bad_names():
    doc = json.loads(run_kvtuner("plan", "--gpu", "RTX 4090", "--gpu", "RTX 3060 12GB", "--json").stdout)
    names = [d["name"] for d in doc["devices"] if d["kind"] == "gpu"]
    assert names == ["RTX 4090 (what-if)", "RTX 3060 12GB (what-if)"]
    assert any("tensor rates of the RTX 4090" in s for s in doc["speed"]["sources"])
    bad = run_kvtuner("plan", "--gpu", "RTX 3060")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "matches several catalogue entries: RTX 3060 8GB, RTX 3060 12GB" in bad.stderr
    unknown = run_kvtuner("plan", "--gpu", "RTX 2090")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "nearest: " in unknown.stderr
    assert "RTX 2080" in unknown.stderr and "Traceback" not in unknown.stderr
    assert run_kvtuner("plan", "--gpu", "Voodoo").returncode == 2
    # an exact name: the 8 GB RTX 2080, never the 11 GB RTX 2080 Ti
    doc = json.loads(run_kvtuner("plan", "--gpu", "RTX 2080", "--json").stdout)
    gpu = next(d for d in doc["devices"] if d["kind"] == "gpu")
    assert gpu["name"] == "RTX 2080 (what-if)" and gpu["capacity_bytes"] == 8 * GiB


def test_export_from_a_tune_plans_for_the_tunes_card(tmp_path):
    """A tune for a named card records its hardware flags; an export of that result plans for them
    (not for this machine), so a partial KV split moves layers to that card's buffer (ROCm0), and
    the export says which hardware it planned for. A flag given to the export wins."""
    tune = run_kvtuner("tune", "--gpu", "RX 7600", "--ctx", "4096", "--no-probe", "--json")
    assert tune.returncode == 0, tune.stderr
    doc = json.loads(tune.stdout)
    assert doc["hardware"] == {"gpu_name": ["RX 7600"]}
    (tmp_path / "t.json").write_text(tune.stdout)
    exp = run_kvtuner(
        "export", "--from-tune", str(tmp_path / "t.json"), "--kv-gpu-layers", "4", "--format", "llama-server"
    )
    assert exp.returncode == 0, exp.stderr
    assert "planned for the tune's hardware: --gpu 'RX 7600'" in exp.stderr
    assert "=ROCm0" in exp.stdout
    own = run_kvtuner(
        "export",
        "--from-tune",
        str(tmp_path / "t.json"),
        "--gpu",
        "RTX 3060 12GB",
        "--kv-gpu-layers",
        "4",
        "--format",
        "llama-server",
    )
    assert own.returncode == 0 and "=CUDA0" in own.stdout and "tune's hardware" not in own.stderr


def test_export_from_a_tune_takes_each_hardware_group_the_export_leaves_unset(tmp_path):
    """The tune's devices, their split and its host are taken group by group: an export's own
    -ts keeps the tune's cards with the export's split; its own --gpu drops the tune's split too;
    its own --host-cores keeps the tune's cards. A hand-edited 'hardware' of the wrong types is one
    line, exit 2."""
    from kvtuner.cli import build_parser
    from kvtuner.cli.args import apply_hardware_flags

    hw = {"gpu_name": ["RX 7600", "RX 7600"], "tensor_split": "2,1", "host_mem": "DDR5-6000x2"}

    def taken(*argv: str) -> dict:
        args = build_parser().parse_args(["export", "--format", "llama-server", *argv])
        return apply_hardware_flags(args, hw)

    assert taken() == hw
    assert taken("-ts", "1,1") == {"gpu_name": ["RX 7600", "RX 7600"], "host_mem": "DDR5-6000x2"}
    assert taken("--gpu", "RTX 3090") == {"host_mem": "DDR5-6000x2"}
    assert taken("--host-cores", "8") == {"gpu_name": ["RX 7600", "RX 7600"], "tensor_split": "2,1"}
    doc = json.loads(run_kvtuner("tune", "--gpu", "RX 7600", "--ctx", "4096", "--no-probe", "--json").stdout)
    for bad in ({"gpu_name": "RX 7600"}, {"host_cores": "x"}, {"no_gpu": False}, {"ram": 32}, {"gpu": ["x"]}):
        (tmp_path / "bad.json").write_text(json.dumps({**doc, "hardware": bad}))
        r = run_kvtuner("export", "--from-tune", str(tmp_path / "bad.json"), "--format", "llama-server")
        assert r.returncode == 2 and "'hardware' has" in r.stderr and "Traceback" not in r.stderr, bad
        assert len(r.stderr.strip().splitlines()) == 1


def test_each_backend_numbers_its_own_devices():
    """An NVIDIA card and an AMD one are CUDA0 and ROCm0, as each ggml backend numbers its devices
    from 0 (not ROCm1 after the CUDA card's slot); the AMD card keeps its CUDA1 slot as the plan's
    key, and an -ot override names it ROCm0 (ROCm1 is one line, exit 2)."""
    doc = json.loads(run_kvtuner("plan", "--gpu", "RTX 3090", "--gpu", "RX 7900 XTX", "--no-probe", "--json").stdout)
    assert [(d["device"], d["backend_device"]) for d in doc["devices"]] == [
        ("CUDA0", "CUDA0"),
        ("CUDA1", "ROCm0"),
        ("CPU", "CPU"),
    ]
    ok = run_kvtuner("plan", "--gpu", "RTX 3090", "--gpu", "RX 7900 XTX", "-ot", "token_embd=ROCm0", "--no-probe")
    assert ok.returncode == 0, ok.stderr
    bad = run_kvtuner("plan", "--gpu", "RTX 3090", "--gpu", "RX 7900 XTX", "-ot", "token_embd=ROCm1", "--no-probe")
    assert bad.returncode == 2 and "ROCm1" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
