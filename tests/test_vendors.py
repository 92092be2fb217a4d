"""GPUs beyond NVIDIA: AMD through a stand-in sysfs tree (real files in a temporary directory,
figures of an RX 7900 XTX and a Strix Halo), contradictory readings flagged, Vulkan's
per-allocation limit on the llama.cpp issue 15009 case, and an Apple M-series what-if planned as
one pool.

The only stand-ins are for hardware this machine lacks: the sysfs files an amdgpu driver would
write, and a ``llama-server`` of a Vulkan build that answers ``--version``, ``--help`` and
``--list-devices`` as llama.cpp prints them (common/arg.cpp).
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from pathlib import Path

import pytest

from kvtuner.core.hardware import vendors as V
from kvtuner.core.hardware.specs import GpuSpec, catalogue_gpu, metal_working_set_bytes, unified_gpu_spec, what_if_gpu
from kvtuner.core.units import GiB, MiB
from kvtuner.testing.cli import run_kvtuner

# RX 7900 XTX: amdgpu's mem_info_vram_total of a 24 GB Navi 31 card (25753026560 bytes = 24560
# MiB, the figure rocm-smi prints as "VRAM Total Memory"); GTT is TTM's default page limit,
# half of a 64 GiB host's visible RAM.
XTX = {
    "vendor": "0x1002",
    "device": "0x744c",
    "mem_info_vram_total": 25753026560,
    "mem_info_vram_used": 1234567168,
    "mem_info_gtt_total": 33636327424,
    "mem_info_gtt_used": 52428800,
}
# Strix Halo (Ryzen AI Max+ 395, 128 GB): the 512 MiB VRAM carve-out Linux guides recommend,
# and a GTT pool raised to 120 GiB through ttm.pages_limit, as those guides do.
STRIX = {
    "vendor": "0x1002",
    "device": "0x1586",
    "mem_info_vram_total": 536870912,
    "mem_info_vram_used": 301989888,
    "mem_info_gtt_total": 120 * GiB,
    "mem_info_gtt_used": 2 * GiB,
}


def _card(root: Path, n: int, files: dict[str, object]) -> Path:
    dev = root / "class" / "drm" / f"card{n}" / "device"
    dev.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (dev / name).write_text(f"{value}\n")
    return dev


@pytest.fixture
def amd_sysfs(tmp_path) -> Path:
    """A sysfs tree with an RX 7900 XTX (card0), a Strix Halo iGPU (card1), a connector and a
    render node that are not cards."""
    root = tmp_path / "sys"
    _card(root, 0, XTX)
    _card(root, 1, STRIX)
    (root / "class" / "drm" / "card0-DP-1").mkdir()
    (root / "class" / "drm" / "renderD128").mkdir()
    return root


def test_sysfs_reads_vram_and_gtt_of_a_dgpu_and_an_apu(amd_sysfs):
    xtx, strix = V.read_sysfs_gpus(amd_sysfs)
    assert (xtx.card, xtx.vendor, xtx.catalogue, xtx.apu) == ("card0", "AMD", "RX 7900 XTX", False)
    assert xtx.vram_total_bytes == 25753026560 and xtx.vram_free_bytes == 25753026560 - 1234567168
    assert (xtx.gtt_total_bytes, xtx.gtt_used_bytes) == (33636327424, 52428800)
    assert xtx.budget_bytes == 25753026560  # a discrete card plans its VRAM only
    assert (strix.name, strix.catalogue, strix.apu) == ("AMD Strix Halo iGPU", "Strix Halo 128GB", True)
    assert strix.budget_bytes == 536870912 + 120 * GiB  # carve-out + GTT: one budget
    assert strix.budget_used_bytes == 301989888 + 2 * GiB
    assert xtx.flags == strix.flags == ()
    specs = V.sysfs_gpu_specs(first_index=1, root=amd_sysfs)
    assert [(g.index, g.backend, g.unified, g.source.split()[0]) for g in specs] == [
        (1, "ROCm", False, "sysfs"),
        (2, "ROCm", True, "sysfs"),
    ]
    assert specs[0].mem_bandwidth_bytes_s == 960e9 and specs[0].free_bytes == 25753026560 - 1234567168


def test_no_sysfs_no_gpus(tmp_path):
    assert V.read_sysfs_gpus(tmp_path / "absent") == []
    (tmp_path / "class" / "drm" / "card0" / "device").mkdir(parents=True)  # a card without amdgpu files
    assert V.read_sysfs_gpus(tmp_path) == []


def test_contradictory_readings_are_flagged_not_trusted(tmp_path):
    # free above total: Vulkan on an Intel iGPU under Windows (llama.cpp issue 29277)
    assert V.check_reading(8 * GiB, 9 * GiB) == (V.FLAG_FREE_ABOVE_TOTAL,)
    assert V.check_reading(8 * GiB, 6 * GiB, 2 * GiB) == ()
    assert V.check_reading(8 * GiB, 6 * GiB, 3 * GiB) == (V.FLAG_USED_PLUS_FREE_ABOVE_TOTAL,)
    # a sysfs card whose used exceeds its total
    root = tmp_path / "sys"
    _card(root, 0, {**XTX, "mem_info_vram_used": 26 * GiB})
    (card,) = V.read_sysfs_gpus(root)
    assert V.FLAG_USED_PLUS_FREE_ABOVE_TOTAL in card.flags
    (spec,) = V.sysfs_gpu_specs(root=root)
    assert spec.free_bytes is None and spec.flags  # shown, not planned with

    # ROCm's hipMemGetInfo blind to another process's 8 GiB (llama.cpp issue 24906): the engine
    # says 23 GiB free, amdgpu's sysfs says 8 GiB are used
    _card(root, 0, {**XTX, "mem_info_vram_used": 8 * GiB})
    from kvtuner.runner.engines import parse_devices

    rocm = parse_devices("  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 23552 MiB free)\n")
    (g,) = V.engine_gpu_specs(rocm, sysfs=V.read_sysfs_gpus(root))
    assert g.flags == (V.FLAG_FREE_ABOVE_DRIVER,)
    assert g.free_bytes == 24560 * MiB - 8 * GiB  # the driver's figure wins
    iris = parse_devices("  Vulkan0: Intel(R) Iris(R) Xe Graphics (8192 MiB, 9000 MiB free)\n")
    (i,) = V.engine_gpu_specs(iris)
    assert i.flags == (V.FLAG_FREE_ABOVE_TOTAL,) and i.free_bytes is None


def test_sampler_shows_amd_vram_and_gtt_live(amd_sysfs):
    from kvtuner.core.hardware.nvml import use_nvml_module
    from kvtuner.core.monitor.sampler import Sampler

    use_nvml_module(_NoNvml())
    try:
        s = Sampler(sysfs_root=str(amd_sysfs))
        _, gpus = s.sample_once()
        assert [(g.index, g.source) for g in gpus] == [(0, "sysfs"), (1, "sysfs")]
        assert gpus[0].used_bytes == 1234567168 and gpus[0].gtt_used_bytes == 52428800
        assert gpus[1].total_bytes == 536870912 + 120 * GiB
        # the model loads: 20 GiB more VRAM on the XTX, 60 GiB more GTT on the Strix Halo
        _card(amd_sysfs, 0, {"mem_info_vram_used": 1234567168 + 20 * GiB})
        _card(amd_sysfs, 1, {"mem_info_gtt_used": 62 * GiB})
        _, gpus = s.sample_once()
        assert gpus[0].used_bytes == 1234567168 + 20 * GiB
        assert gpus[1].gtt_used_bytes == 62 * GiB and gpus[1].used_bytes == 301989888 + 62 * GiB
        assert s.peaks().gpu_used_bytes == {0: 1234567168 + 20 * GiB, 1: 301989888 + 62 * GiB}
        assert len(s.gpu_samples(1)) == 2
    finally:
        use_nvml_module(None)


class _NoNvml:
    """NVML as on a machine without an NVIDIA driver (the library's init fails)."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self):  # noqa: N802 (NVML's own name)
        raise self.NVMLError("NVML Shared Library Not Found")


_kvtuner = functools.partial(run_kvtuner, checkout=True, timeout=180)


@pytest.mark.slow
def test_plan_shows_and_plans_for_amd_from_sysfs(amd_sysfs, default_model):
    out = _kvtuner("plan", str(default_model), "-c", "4096", "--json", extra_env={V.SYSFS_ROOT_ENV: str(amd_sysfs)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    gpus = [d for d in doc["devices"] if d["kind"] == "gpu"]
    names = [d["name"] for d in gpus]
    if names[:1] != ["AMD Radeon RX 7900 XTX"]:  # an NVIDIA card on this machine comes first
        gpus = [d for d in gpus if d["name"].startswith("AMD")]
    assert [d["name"] for d in gpus] == ["AMD Radeon RX 7900 XTX", "AMD Strix Halo iGPU"]
    assert gpus[0]["capacity_bytes"] == 25753026560
    assert gpus[0]["free_bytes"] == 25753026560 - 1234567168
    assert gpus[1]["capacity_bytes"] == 536870912 + 120 * GiB
    assert gpus[0]["weights_bytes"] > 0  # layers planned onto the AMD card
    assert any(a["id"] == "unified-memory-pool" for a in doc["advice"])


# -- Vulkan: one allocation's limit (llama.cpp issue 15009) ---------------------------------------

#: A Vulkan build's ``--list-devices`` in llama.cpp's format (common/arg.cpp), with the figures of
#: a Strix Halo whose UMA heap is 64 GiB (vulkaninfo in llama.cpp issue 16832: heap 64.00 GiB,
#: budget 60.80 GiB).
LIST_DEVICES_VULKAN_STRIX = """\
ggml_vulkan: Found 1 Vulkan devices:
ggml_vulkan: 0 = Radeon 8060S Graphics (RADV GFX1151) (radv) | uma: 1 | fp16: 1 | bf16: 0 | warp size: 64 | shared memory: 65536 | int dot: 1 | matrix cores: KHR_coopmat
Available devices:
  Vulkan0: Radeon 8060S Graphics (RADV GFX1151) (65536 MiB, 62259 MiB free)
"""


@pytest.fixture
def vulkan_server(tmp_path) -> Path:
    """A stand-in llama-server of a Vulkan build (this machine has no Vulkan GPU)."""
    listing = tmp_path / "list-devices.txt"
    listing.write_text(LIST_DEVICES_VULKAN_STRIX)
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text(f"""#!/bin/sh
case "$1" in
  --version) echo "version: 11434 (build 11434, commit 0a1b2c3)"; echo "built with cc for x86_64-linux-gnu";;
  --list-devices) cat '{listing}';;
  --help) printf '%s\\n' "-c,    --ctx-size N    size of the prompt context" "-fa,   --flash-attn [on|off|auto]  flash attention";;
esac
""")
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    return server


@pytest.fixture(scope="module")
def qwen3_30b_a3b(tmp_path_factory) -> Path:
    """A sparse Qwen3-30B-A3B Q8_0 file (the model of llama.cpp issue 15009)."""
    from kvtuner.testing.gguf_factory import QWEN3_30B_A3B, q8_0, write_model

    return write_model(tmp_path_factory.mktemp("q3") / "qwen3-30b-a3b-q8_0.gguf", q8_0(QWEN3_30B_A3B))


@pytest.mark.slow
def test_vulkan_allocation_limit_on_the_15009_case(vulkan_server, qwen3_30b_a3b, tmp_path):
    empty = tmp_path / "nosys"
    args = ("plan", str(qwen3_30b_a3b), "--engine", str(vulkan_server), "-c", "70000", "--json")
    env = {V.SYSFS_ROOT_ENV: str(empty), "KVTUNER_CACHE_DIR": str(tmp_path / "cache")}
    out = _kvtuner(*args, "-fa", "off", extra_env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    gpus = [d for d in doc["devices"] if d["kind"] == "gpu"]
    vk = [d for d in gpus if d["name"].startswith("Vulkan0")]
    assert vk and vk[0]["capacity_bytes"] == 65536 * MiB
    (adv,) = [a for a in doc["advice"] if a["id"] == "vulkan-allocation-limit"]
    assert adv["severity"] == "error"
    # 70144 cells (70000 padded to 256) x 512 tokens x 32 heads x 4 bytes = 4384 MiB > 4 GiB
    assert "4.28 GiB" in adv["message"] or "4384" in adv["message"], adv["message"]
    assert adv["fix"] == {"flash_attn": "on"}
    # the KV cache itself (6564 MiB in issue 15009's log) is split per layer: no tensor over the limit
    on = json.loads(_kvtuner(*args, "-fa", "on", extra_env=env).stdout)
    assert not [a for a in on["advice"] if a["id"] == "vulkan-allocation-limit"]


def test_vulkan_limit_follows_the_ggml_override(monkeypatch):
    from kvtuner.core.advice.backends import (
        VULKAN_MAX_ALLOCATION_BYTES,
        vulkan_max_allocation_bytes,
    )

    assert vulkan_max_allocation_bytes() == VULKAN_MAX_ALLOCATION_BYTES == 4 * GiB
    monkeypatch.setenv("GGML_VK_FORCE_MAX_ALLOCATION_SIZE", str(2 * GiB))
    assert vulkan_max_allocation_bytes() == 2 * GiB


# -- Apple M-series: one pool with Metal's working-set limit -------------------------------------


def test_metal_working_set_defaults_and_the_sysctl():
    assert metal_working_set_bytes(16 * GiB) == 16 * GiB * 2 // 3  # 11453.25 MB in llama.cpp's log
    assert metal_working_set_bytes(64 * GiB) == 48 * GiB  # 51539.61 MB
    assert metal_working_set_bytes(64 * GiB, wired_limit_mb=56 * 1024) == 56 * GiB


def test_apple_what_if_plans_one_pool(default_profile):
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.session import Session

    m2 = catalogue_gpu("M2 Max")
    assert (m2.backend, m2.unified, m2.ram_bytes, m2.total_bytes) == ("Metal", True, 96 * GiB, 72 * GiB)
    host = HostSpec(total_bytes=96 * GiB, available_bytes=90 * GiB)
    s = Session(model=default_profile, config=PlanConfig(n_ctx=8192), gpus=(m2,), host=host)
    a = s.assess()
    gpu = a.plan.gpus[0]
    assert gpu.capacity_bytes == 72 * GiB  # the GPU's share, not the whole RAM
    (pool,) = [x for x in a.advice if x.id == "unified-memory-pool"]
    assert pool.severity == "info" and "96.00 GiB pool" in pool.message
    # a small Mac: the same model at a huge context overflows the pool
    from kvtuner.core.hardware.gpu_catalogue import find_gpu

    small = unified_gpu_spec(find_gpu("M2 Max"), ram_bytes=1 * GiB)
    assert small.total_bytes == GiB * 2 // 3
    s2 = Session(
        model=default_profile,
        config=PlanConfig(n_ctx=32768),
        gpus=(small,),
        host=HostSpec(total_bytes=1 * GiB, available_bytes=1 * GiB),
    )
    (pool2,) = [x for x in s2.assess().advice if x.id == "unified-memory-pool"]
    assert pool2.severity == "error", pool2.message


@pytest.mark.slow
def test_plan_cli_apple_what_if_takes_the_macs_ram(default_model):
    out = _kvtuner("plan", str(default_model), "--gpu", "M4 Max", "-c", "8192", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (gpu,) = [d for d in doc["devices"] if d["kind"] == "gpu"]
    host = next(d for d in doc["devices"] if d["kind"] == "host")
    assert gpu["capacity_bytes"] == 96 * GiB and host["capacity_bytes"] == 128 * GiB
    assert [a["severity"] for a in doc["advice"] if a["id"] == "unified-memory-pool"] == ["info"]


def test_gpu_spec_defaults_stay_cuda():
    g = GpuSpec(name="x", total_bytes=GiB)
    assert (g.backend, g.unified, g.device) == ("CUDA", False, "CUDA0")


# -- the window ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_window_shows_amd_vram_and_gtt_live_and_plans_for_it(qtbot, amd_sysfs, monkeypatch, tmp_path, make_window):
    pytest.importorskip("PySide6")
    pytest.importorskip("pyqtgraph")
    from kvtuner.core.hardware.nvml import use_nvml_module
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.testing.gui_support import NO_MODEL

    monkeypatch.setenv(V.SYSFS_ROOT_ENV, str(amd_sysfs))
    use_nvml_module(_NoNvml())
    try:
        w = make_window(PlanConfig(n_ctx=4096), hardware=None, sampler=None, model=NO_MODEL)  # as detected here
        text = w.hardware.detected_label.text()
        assert "ROCm0 AMD Radeon RX 7900 XTX, 23.98 GiB (sysfs)" in text, text
        assert "ROCm1 AMD Strix Halo iGPU" in text and "one pool with the CPU" in text
        w.open_model(None)
        qtbot.waitUntil(lambda: w.model is not None, timeout=30_000)
        qtbot.waitUntil(lambda: len(w.plan.gpus) == 2, timeout=10_000)
        assert w.plan.gpus[0].capacity_bytes == 25753026560 and w.plan.gpus[0].weights_bytes > 0
        w.sampler.sample_once()
        _card(amd_sysfs, 0, {"mem_info_vram_used": 5 * GiB, "mem_info_gtt_used": 1 * GiB})
        w.sampler.sample_once()
        w.pull()
        assert "gtt0" in w.graphs.series and "gtt1" in w.graphs.series
        assert w.gpu_last[0].used_bytes == 5 * GiB and w.gpu_last[0].gtt_used_bytes == GiB
        vram = w.status.fields["vram"].text()
        assert vram.startswith("VRAM 5.0 GiB of 24.0 GiB, GTT 1.0 GiB of 31.3 GiB"), vram
        w.close()
    finally:
        use_nvml_module(None)


def test_plan_json_names_each_device_by_its_backend(amd_sysfs):
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.model.default_model import default_model_path
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory

    model = ModelProfile.from_gguf(default_model_path())
    gpus = [*V.sysfs_gpu_specs(root=amd_sysfs), catalogue_gpu("M4 Max", index=2)]
    plan = plan_memory(model, PlanConfig(n_ctx=2048), gpus, HostSpec(total_bytes=64 * GiB))
    rows = [(d["device"], d["backend"], d["backend_device"], d["unified"]) for d in (x.to_dict() for x in plan.gpus)]
    assert rows == [
        ("CUDA0", "ROCm", "ROCm0", False),
        ("CUDA1", "ROCm", "ROCm1", True),
        ("CUDA2", "Metal", "MTL0", True),  # each backend numbers its own devices from 0
    ]


def test_apple_silicon_detected_as_one_metal_pool(monkeypatch):
    """macOS on Apple silicon, stood in: the platform, the machine, and the two sysctl answers."""
    import platform

    import psutil

    from kvtuner.core.hardware import host

    answers = {"iogpu.wired_limit_mb": "0", "machdep.cpu.brand_string": "Apple M2 Max"}

    class _Done:
        def __init__(self, out):
            self.stdout = out

    def fake_run(argv, **kw):
        assert argv[:2] == ["sysctl", "-n"]
        return _Done(answers[argv[2]] + "\n")

    monkeypatch.setattr(V.sys, "platform", "darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(V.subprocess, "run", fake_run)
    monkeypatch.setattr(host, "cpu_name", lambda: answers["machdep.cpu.brand_string"])
    ram = psutil.virtual_memory().total
    (g,) = V.apple_gpu_specs()
    assert (g.backend, g.unified, g.ram_bytes, g.catalogue) == ("Metal", True, ram, "M2 Max 96GB")
    assert g.total_bytes == metal_working_set_bytes(ram) and g.free_bytes <= g.total_bytes
    assert g.mem_bandwidth_bytes_s == 400e9
    answers["iogpu.wired_limit_mb"] = str(ram // MiB - 1024)  # raised to all but 1 GiB
    (g,) = V.apple_gpu_specs()
    assert g.total_bytes == ram // MiB * MiB - GiB
    monkeypatch.setattr(V.sys, "platform", "linux")
    assert V.apple_gpu_specs() == []


def test_host_facts_without_proc(monkeypatch):
    """Windows and macOS have no /proc: RAM, swap and a process's RSS come from psutil."""
    import psutil

    from kvtuner.core.hardware import host

    monkeypatch.setattr(host, "_LINUX_FAST", False)
    total, avail, _swap, _sin, _sout = host.read_host_counters()
    assert total == psutil.virtual_memory().total and 0 < avail <= total
    assert host.process_rss_bytes(os.getpid()) == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)


def test_cli_gpus_lists_the_cards_plan_finds(amd_sysfs):
    """``kvtuner gpus`` detects what ``plan`` plans on (NVML, then sysfs, then Apple): an AMD card
    found in sysfs is listed as ROCm0 with the catalogue entry it matched, not "no GPU detected"."""
    out = _kvtuner("gpus", extra_env={V.SYSFS_ROOT_ENV: str(amd_sysfs)})
    assert out.returncode == 0, out.stderr
    # ROCm0, or later in the list when an NVIDIA card of this machine comes first
    assert re.search(r"detected ROCm\d: AMD Radeon RX 7900 XTX \(sysfs.*-> RX 7900 XTX", out.stdout), out.stdout
    assert "no GPU detected" not in out.stdout
    doc = json.loads(_kvtuner("gpus", "--json", extra_env={V.SYSFS_ROOT_ENV: str(amd_sysfs)}).stdout)
    amd = [d for d in doc["detected"] if d["backend"] == "ROCm"]
    assert [d["name"] for d in amd] == ["AMD Radeon RX 7900 XTX", "AMD Strix Halo iGPU"]
    assert amd[0]["catalogue"] == "RX 7900 XTX" and amd[0]["backend_device"].startswith("ROCm")


def test_an_nvidia_and_an_amd_card_need_two_backends_no_build_holds(default_profile):
    """CUDA and ROCm cannot share a llama-server (ggml-hip builds ggml-cuda's sources): the plan
    says so and names each card as its backend does; two cards of one vendor, or a card beside an
    rpc-server, raise nothing."""
    from kvtuner.core.advice.backends import advise_backends
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.plan.placement import DeviceSplit

    def ids(*names: str) -> list[str]:
        gpus = [catalogue_gpu(n, index=i) for i, n in enumerate(names)]
        return [a.id for a in advise_backends(plan_memory(default_profile, PlanConfig(n_ctx=1024), gpus), gpus)]

    assert ids("RTX 3090", "RTX 3060 12GB") == [] and ids("RX 7900 XTX", "RX 7600") == []
    assert ids("RX 7600", "RTX 3060 12GB") == ["mixed-backends"]
    # a card of unknown vendor (--gpu-mem), or an AMD card that holds nothing (-sm none), does not count
    generic = what_if_gpu(12 * GiB)
    amd = catalogue_gpu("RX 7900 XTX", index=1)
    p = plan_memory(default_profile, PlanConfig(n_ctx=1024), [generic, amd])
    assert [a.id for a in advise_backends(p, [generic, amd])] == []
    two = [catalogue_gpu("RTX 3090"), amd]
    p = plan_memory(default_profile, PlanConfig(n_ctx=1024), two, split=DeviceSplit(split_mode="none"))
    assert p.gpus[1].weights_bytes == 0 and [a.id for a in advise_backends(p, two)] == []
    cp = run_kvtuner("plan", "--gpu", "RTX 3090", "--gpu", "RX 7900 XTX", "--gpu", "RX 7600", "--no-probe", "--json")
    assert cp.returncode == 0, cp.stderr
    (adv,) = [a for a in json.loads(cp.stdout)["advice"] if a["id"] == "mixed-backends"]
    assert adv["severity"] == "warning" and not adv["fix"]
    assert adv["message"].startswith("CUDA0 RTX 3090 (what-if), ROCm0 RX 7900 XTX (what-if) and ROCm1 RX 7600")
    assert "Vulkan build" in adv["message"] and "rpc-server" in adv["message"]
    assert "llama.cpp#29048" in adv["reason"]
