"""The GPU truth script (benchmarks/gpu_truth) in its CPU rehearsal, so it cannot rot.

The device run happens on a lent GPU machine with 15 minutes in all; these tests make sure the same
code paths (run.sh, gpu_truth.py, probe.py, the fixtures, the kvtuner command lines it parses)
still work here, on the CPU backend, in a few seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtuner.testing.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
GT = ROOT / "benchmarks" / "gpu_truth"
gpu_truth = load_script("benchmarks/gpu_truth/gpu_truth.py")


def test_parse_log_reads_llama_cpp_buffer_lines():
    lines = [
        ["info", "load_tensors: offloaded 33/33 layers to GPU"],
        ["info", "load_tensors:        CUDA0 model buffer size =  4403.49 MiB"],
        ["info", "load_tensors:   CPU_Mapped model buffer size =   281.81 MiB"],
        ["info", "llama_context:  CUDA_Host  output buffer size =     0.49 MiB"],
        ["info", "llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB"],
        [
            "info",
            "llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB",
        ],
        ["info", "sched_reserve:      CUDA0 compute buffer size =   258.50 MiB"],
        ["info", "sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB"],
        [
            "info",
            "sched_reserve: graph (pp bs=512, tg bs=1): nodes = 1030 / 998, splits = 2 / 2, input objects = 4, input tensors = 6",
        ],
        ["error", "llama_init_from_model: something went wrong"],
    ]
    p = gpu_truth.parse_log(lines)
    assert p["model_mib"] == {"CUDA0": 4403.49, "CPU_Mapped": 281.81}
    assert p["kv_mib"] == {"CUDA0": 1024.0}
    assert p["compute_mib"] == {"CUDA0": 258.5, "CUDA_Host": 24.01}
    assert p["output_mib"] == {"CUDA_Host": 0.49}
    assert p["kv_caches"][0]["cells"] == 8192 and p["kv_caches"][0]["type_v"] == "f16"
    assert p["graph"] == {"nodes_pp": 1030, "nodes_tg": 998, "splits_pp": 2, "splits_tg": 2}
    assert p["offloaded"] == [33, 33]
    assert p["errors"] == ["llama_init_from_model: something went wrong"]
    assert gpu_truth.by_device(p["compute_mib"]) == {"gpu": 258.5, "host": 24.01}


def test_export_line_becomes_probe_parameters():
    line = (
        "llama-server -m '/tmp/my model.gguf' -c 8192 -ngl 9 --fit off -fa on -ctk q8_0 -ctv q8_0 -np 1 -b 2048 "
        "-ub 512 -ot 'blk\\.(0|1|2)\\.=CUDA0' -nkvo --swa-full"
    )
    spec, notes = gpu_truth.probe_spec_from_export(line)
    assert spec["model"] == "/tmp/my model.gguf"
    assert spec["n_gpu_layers"] == 9
    assert spec["overrides"] == [["blk\\.(0|1|2)\\.", "CUDA0"]]
    assert spec["ctx"] == {
        "n_ctx": 8192,
        "flash_attn": "on",
        "type_k": "q8_0",
        "type_v": "q8_0",
        "n_seq_max": 1,
        "n_batch": 2048,
        "n_ubatch": 512,
        "offload_kqv": False,
        "swa_full": True,
    }
    assert notes == []
    spec, notes = gpu_truth.probe_spec_from_export("llama-server -m x.gguf -ngl all --mystery")
    assert spec["n_gpu_layers"] == -1 and notes == ["export flag not translated: --mystery"]


def test_predicted_decode_is_interpolated_on_the_curve():
    speed = {"curve": [[0, 100.0], [1000, 50.0], [2000, 40.0]]}
    assert gpu_truth.predicted_decode_at(speed, 500) == 75.0
    assert gpu_truth.predicted_decode_at(speed, 5000) == 40.0
    assert gpu_truth.predicted_decode_at({}, 5) is None


def test_compare_cells():
    assert gpu_truth.compare(110 * gpu_truth.MiB, 100.0)["rel_err"] == 0.1
    assert gpu_truth.compare(0, 0.0)["rel_err"] == 0.0
    c = gpu_truth.compare(5 * gpu_truth.MiB, 0.0)
    assert c["rel_err"] is None and c["abs_mib"] == 5.0
    assert gpu_truth.fmt_cell(gpu_truth.compare(110 * gpu_truth.MiB, 100.0)) == "110.0 / 100.0 (+10.0%)"


def test_device_command_line_fits_the_tool():
    """The device tool takes commands of at most 2000 characters; the README's must fit."""
    import re

    readme = (GT / "README.md").read_text()
    commands = re.findall(r'run\(command="([^"]+)"', readme)
    assert len(commands) == 4, "README.md shows the device commands (one call, build + measure, the sweep)"
    assert any("--phases sweep" in c for c in commands)
    assert all(c.startswith("bash benchmarks/gpu_truth/run.sh ") and len(c) < 2000 for c in commands)
    assert all('carry=[".gpu_truth_carry"]' in ln for ln in readme.splitlines() if "run(command=" in ln)


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_cpu_rehearsal_quick(tmp_path):
    """``run.sh measure --cpu --quick``: fixtures, one overhead probe, three buffer rows (a real
    load, a dry run, the default model's zero-weight copy) and one bench, with outputs."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), GPU_TRUTH_WORK=str(work))
    r = subprocess.run(
        ["bash", str(GT / "run.sh"), "measure", "--cpu", "--quick", "--budget-s", "150"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=str(ROOT),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PHASE wheels" in r.stdout
    doc = json.loads((out / "gpu_truth.json").read_text())
    md = (out / "gpu_truth.md").read_text()
    assert doc["schema"] == gpu_truth.SCHEMA and doc["mode"] == "cpu" and doc["final"] is True
    assert set(doc["phases_s"]) >= {"fixtures", "overhead", "buffers_1", "speed_1"}
    assert not doc["errors"] and not doc["skipped"]

    rows = {r["key"]: r for r in doc["buffers"]}
    tiny = rows["tiny-full-2k"]
    assert tiny.get("error") is None, tiny
    assert tiny["real_load"] is True and tiny["probe"]["ok"] is True
    assert tiny["llama_server"].startswith("llama-server -m ")
    cells = tiny["compare"]["cells"]
    assert cells["kv_total"]["rel_err"] == 0.0  # kvtuner's KV bytes are exact
    assert cells["host_kv"]["rel_err"] == 0.0
    assert cells["output"]["rel_err"] == 0.0
    assert tiny["kvtuner_dry_run"]["same_compute"] and tiny["kvtuner_dry_run"]["same_kv"]
    assert tiny["llama"]["graph"]["splits_pp"] >= 1
    dry = rows["tiny-nkvo-2k"]
    assert dry.get("error") is None and dry["real_load"] is False and "-nkvo" in dry["llama_server"]
    default = rows["default-q8kv-8k"]
    if not any(f["key"] == "gemma3-270m-zero" and f.get("error") for f in doc["fixtures"]):
        assert default.get("error") is None, default
        assert [c["cells"] for c in default["llama"]["kv_caches"]] == [8192, 1024]  # the real header's shapes

    (ov,) = doc["overhead"]
    assert ov.get("error") is None and ov["result"]["after_decode"]["rss_bytes"] > 0
    (sp,) = doc["speed"]
    assert sp.get("error") is None, sp
    assert sp["measured"]["decode_tok_s"] > 0 and sp["predicted"]["decode_tok_s"] > 0
    assert "| tiny-full-2k |" in md and "## Speed" in md


def test_sweep_rows_cover_the_regimes_and_translate_for_the_probe():
    """The offload sweep's GPU rows: -ngl steps, -nkvo, the KV split, --n-cpu-moe steps, -ub
    512/2048/4096 with experts in RAM, op offload on and off, depths 0/8K/32K, each within its
    context; the export line's --n-cpu-moe becomes llama.cpp's own per-layer CPU overrides."""
    rows = gpu_truth.sweep_rows_gpu()
    flags = [" ".join(r.flags) for r in rows]
    assert len({r.key for r in rows}) == len(rows)
    for want in (
        "--ngl 24",
        "--ngl 16",
        "--ngl 8",
        "--kv-gpu-layers 0",
        "--kv-gpu-layers 16",
        "--n-cpu-moe 6",
        "--n-cpu-moe 12",
        "--n-cpu-moe 24",
        "-ub 2048",
        "-ub 4096",
    ):
        assert any(want in f for f in flags), want
    assert any(not r.op_offload for r in rows) and {0, 8192, 32768} <= {d for r in rows for d in r.depths}
    for r in rows:
        ctx = int(r.flags[r.flags.index("--ctx") + 1])
        assert max(r.depths) + r.n_prompt + r.n_gen + 8 <= ctx, r.key
    keys = [r.key for r in rows]  # the budget guard cuts the tail: experts in RAM and -ub first
    assert keys.index("oss-cpumoe24-ub512") < 2 and keys.index("oss-cpumoe24-ub4096") < 2
    spec, notes = gpu_truth.probe_spec_from_export(
        "llama-server -m m.gguf -c 40960 -ngl all -ub 4096 -b 4096 --n-cpu-moe 2 --no-op-offload"
    )
    assert notes == [] and spec["ctx"]["op_offload"] is False and spec["ctx"]["n_ubatch"] == 4096
    assert spec["overrides"] == [
        ["blk\\.0\\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"],
        ["blk\\.1\\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"],
    ]
    doc = {
        "mode": "gpu",
        "sweep": [
            {
                "key": "oss-cpumoe24-ub512",
                "flags": ["--n-cpu-moe", "24"],
                "op_offload": True,
                "results": [
                    {
                        "depth": 0,
                        "predicted_prefill_tok_s": 900.0,
                        "measured_prefill_tok_s": 1000.0,
                        "prefill_ratio": 0.9,
                        "predicted_decode_tok_s": 40.0,
                        "measured_decode_tok_s": 50.0,
                        "decode_ratio": 0.8,
                    }
                ],
            }
        ],
    }
    md = gpu_truth.render_md(doc)
    assert (
        "## Offload sweep" in md and "| oss-cpumoe24-ub512 | `--n-cpu-moe 24` | on | 0 | 900.0 / 1000.0 (0.9) |" in md
    )
    assert gpu_truth.summarise(doc)["sweep_pred_over_meas"] == {"oss-cpumoe24-ub512@0": {"decode": 0.8, "prefill": 0.9}}


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_sweep_rehearsal_quick(tmp_path):
    """``run.sh measure --cpu --quick --phases sweep``: the tiny MoE (random routing data) with
    experts on the CPU at depths 0 and 256, and a dense row with op offload off, timed by probe.py and predicted by
    ``plan --prompt``."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), GPU_TRUTH_WORK=str(work), KVTUNER_CPU_PROBE="off")
    r = subprocess.run(
        ["bash", str(GT / "run.sh"), "measure", "--cpu", "--quick", "--phases", "sweep", "--budget-s", "150"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=str(ROOT),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "gpu_truth.json").read_text())
    assert not doc["errors"] and not doc["skipped"] and doc["final"] is True
    fixtures = {f["key"]: f for f in doc["fixtures"]}
    assert fixtures["tiny-moe-f16"]["routing"].startswith("random token embeddings")  # routes like a real MoE
    rows = {x["key"]: x for x in doc["sweep"]}
    moe = rows["tiny-moe-cpumoe2"]
    assert moe.get("error") is None and "--n-cpu-moe 2" in moe["llama_server"]
    assert [x["depth"] for x in moe["results"]] == [0, 256]
    for x in moe["results"]:
        assert x["measured_prefill_tok_s"] > 0 and x["measured_decode_tok_s"] > 0 and x["predicted_decode_tok_s"] > 0
    assert moe["results"][0]["prefill_ratio"] is not None  # plan --prompt 64 predicts this very prompt
    off = rows["tiny-ngl2-noopoff"]
    assert off["op_offload"] is False and off["llama_server"].endswith("--no-op-offload") and off["prediction_note"]
    assert "## Offload sweep" in (out / "gpu_truth.md").read_text()


def test_gpu_rows_are_computed_from_a_gpu_plan_and_a_cuda_log(tmp_path):
    """The GPU-only paths (CUDA0 / CUDA_Host cells, the overhead arithmetic, the Markdown) on a
    what-if GPU plan and a CUDA-shaped log, so they cannot break unseen before the device run."""
    from kvtuner.testing.gguf_factory import LLAMA31_8B, q4_k_m, write_model

    model = write_model(tmp_path / "l8.gguf", q4_k_m(LLAMA31_8B))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtuner.cli",
            "plan",
            str(model),
            "--ctx",
            "8192",
            "-fa",
            "on",
            "--ngl",
            "16",
            "--gpu-mem",
            "141G",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    gpu = next(d for d in plan["devices"] if d["kind"] == "gpu")
    mib = gpu_truth.MiB
    lines = [
        ["info", f"load_tensors:        CUDA0 model buffer size = {gpu['weights_bytes'] / mib:8.2f} MiB"],
        ["info", "load_tensors:   CPU_Mapped model buffer size =  2400.00 MiB"],
        ["info", "llama_kv_cache:      CUDA0 KV buffer size =   480.00 MiB"],
        ["info", "llama_kv_cache:        CPU KV buffer size =   544.00 MiB"],
        [
            "info",
            "llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB",
        ],
        ["info", "llama_context:  CUDA_Host  output buffer size =     0.49 MiB"],
        ["info", "sched_reserve:      CUDA0 compute buffer size =   300.00 MiB"],
        ["info", "sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB"],
        ["info", "sched_reserve: graph: nodes = 1158, splits = 3, input objects = 4, input tensors = 6"],
    ]
    parsed = gpu_truth.parse_log(lines)
    cmp_ = gpu_truth.buffer_comparison(plan, parsed, real=True)
    cells = cmp_["cells"]
    assert cells["gpu_weights"]["rel_err"] == 0.0
    assert cells["kv_total"]["rel_err"] == 0.0
    assert {"gpu_kv", "gpu_compute", "host_compute", "host_kv", "host_weights", "output"} <= set(cells)
    assert cmp_["llama_cuda_host_compute_mib"] == 24.01 and cmp_["llama_cpu_compute_mib"] == 0.0
    assert parsed["graph"]["splits_pp"] == 3

    G = 1 << 30
    mem = [
        {"stage": "process_start", "nvml_used_bytes": 1 * G, "nvml_free_bytes": 139 * G, "rss_bytes": 50 * mib},
        {
            "stage": "cuda_context",
            "nvml_used_bytes": 1 * G + 500 * mib,
            "nvml_free_bytes": 139 * G - 500 * mib,
            "cuda_free_bytes": 139 * G - 500 * mib,
            "cuda_total_bytes": 140 * G,
            "rss_bytes": 300 * mib,
        },
        {
            "stage": "after_decode",
            "nvml_used_bytes": 1 * G + 500 * mib + int((gpu["weights_bytes"] / mib + 780) * mib) + 200 * mib,
            "cuda_free_bytes": 100 * G,
            "cuda_total_bytes": 140 * G,
            "rss_bytes": 900 * mib,
        },
    ]
    res = gpu_truth.overhead_result(mem, parsed)
    assert res["cuda_context"]["overhead_bytes_nvml"] == 500 * mib
    assert res["cuda_context"]["overhead_bytes_cuda"] == 500 * mib
    assert abs(res["after_decode"]["overhead_bytes_nvml"] - 700 * mib) < mib  # 500 context + 200 beyond the buffers

    doc = {
        "mode": "gpu",
        "buffers": [
            {
                "key": "x",
                "fixture": "l8",
                "real_load": True,
                "compare": cmp_,
                "llama": parsed,
                "kvtuner_dry_run": {"same_compute": True, "same_output": True, "same_kv": True},
            }
        ],
        "overhead": [{"key": "o", "result": res, "kvtuner_overhead_bytes": {"gpu": 400 * mib, "host": 160 * mib}}],
        "speed": [
            {
                "key": "s",
                "fixture": "l8",
                "flags": ["-fa", "on"],
                "n_depth": 0,
                "predicted": {"decode_tok_s": 150.0, "prefill_tok_s": 9000.0},
                "measured": {"decode_tok_s": 160.0, "prefill_tok_s": 8000.0},
                "decode_tok_s_ratio": 0.938,
                "vram_used_by_run_bytes": 6 * G,
                "planned_gpu_total_bytes": 6 * G,
            }
        ],
    }
    md = gpu_truth.render_md(doc)
    assert "| x | l8 | yes |" in md and "| 500.0 / 500.0 |" in md and "150.0 / 160.0" in md
    assert gpu_truth.summarise(doc)["decode_pred_over_meas"] == {"s": 0.938}
