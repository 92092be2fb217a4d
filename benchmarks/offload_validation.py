"""Speed where the model does not fit: kvtuner's prediction against public measurements with
layers, experts or the KV cache in system RAM, on named GPUs and named hosts.

Rows: ``benchmarks/offload_public_rows.json`` (each with its source page, a verbatim excerpt and
the split, fixed before any prediction was made: per regime the rows of one designated source are
``fit``, all others ``validate``; same-host full-offload rows are ``reference``) and
``benchmarks/offload_public_rows_more.json`` (rows collected later from other sources, blind to the
predictions: ``validate`` and ``reference`` only). Regimes:
``partial_ngl`` (-ngl below the layer count), ``experts_cpu`` (--n-cpu-moe, -ot exps=CPU),
``kv_ram`` (-nkvo), ``long_depth`` (llama-bench -d, long server prompts), ``full``.

Each row is predicted from what its page states and nothing measured:

- the model: a zero-weight GGUF of the model's published shape (kvtuner/testing/gguf_families.py,
  kvtuner/testing/gguf_factory.py; :data:`SHAPES`) with the quant's per-tensor types (:func:`quantize`);
  a family the fixtures cannot write is listed as skipped with the reason;
- the GPU: the catalogue card of that name (kvtuner.core.hardware.gpu_catalogue);
- the host: a what-if host (kvtuner.core.hardware.specs.HostSpec ``what_if``) with the RAM's
  typical achieved bandwidth from the memory catalogue (``--host-mem TYPE-MTSxCHANNELS``), or the
  page's GB/s (``--host-bw``: as it is when the page calls it measured, else taken for the RAM's
  theoretical figure times its type's typical share); the cores llama.cpp uses (the row's threads,
  else the CPU's physical cores: llama.cpp's default ``common_cpu_get_num_math``); the PCIe link
  when stated (``--pcie``). No CPU probe of that host exists, so its kernels are the reference
  core's (speed_model.reference_core_rates) with the decode capped at llama.cpp's share of that
  RAM bandwidth (speed_model.HOST_DECODE_BW_SHARE), as ``kvtuner plan`` on a what-if host without
  a probe of the model does.
- skipped, with the reason: a model the fixtures cannot write, a card not in the catalogue, experts
  on the CPU without the page saying which (``-ncmoe``, ``--cpu-moe``, ``-ot``), and a plan kvtuner
  says does not fit the card (its answer there is "does not fit", not a speed).
- the run: llama-bench's defaults where the page is silent (n_batch 2048, n_ubatch 512, f16 K/V,
  flash attention as the row says, else auto); ``ppN`` is predicted as a prefill of N tokens at
  the row's depth, ``tgN`` as N decoded tokens averaged over their depths; a llama-server row's
  decode after a P-token prompt at depth P + 128 (the reply length is not stated).

Assumptions a row cannot state are fixed rules, listed with each row (``assumed``): RAM channels
not stated -> a desktop CPU's 2, a server/workstation CPU's capacity / 16 GB per DIMM capped at
its platform's channels; RAM or its speed not stated -> the CPU's rated memory
(:data:`CPU_RATED_MEMORY`); quant not stated -> MXFP4 for gpt-oss (the ggml-org release), else
Q4_K_M.

``--h200``: every speed row of the H200 GPU truth run (benchmarks/gpu_truth/results/, the
JSON beside 2026-11-30-h200.md) re-predicted with today's model, for a host spec of that machine
(:data:`H200_HOST`).

    python benchmarks/offload_validation.py [--sets fit,validate,reference] [--markdown] [--h200] [--rows FILE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROWS = ROOT / "benchmarks" / "offload_public_rows.json"
#: A memory type as pages write it (DDR4, DDR5, LPDDR5X ...).
RAM_TYPE = r"(?:LP)?DDR\dX?"
#: Rows collected after the speed model's host terms were fixed, from sources not in :data:`ROWS`:
#: validation (and same-host reference) rows only.
ROWS_MORE = ROOT / "benchmarks" / "offload_public_rows_more.json"
H200_RESULTS = ROOT / "benchmarks" / "gpu_truth" / "results" / "2026-11-30-h200.json"
REGIMES = ("partial_ngl", "experts_cpu", "kv_ram", "long_depth", "full")
SETS = ("fit", "validate", "reference")
#: Validation sources whose errors were looked at while the model or this script's rules changed,
#: so the table also gives the validation figures without them ("validate*"): kratos-7800xt and
#: llmfit were the fitting rows under the data file's first split rule when the what-if host's CPU
#: rates changed; inventivehq and llmfit's DDR4 hosts, 30-94 % high, are why a share of the RAM
#: bandwidth was fitted (on other rows: HOST_DECODE_BW_SHARE); carteakey-4070's blog was read to
#: find why its prefill rows miss; compiledthoughts-5060ti-9700x and jordanfablefur-5090-285k are
#: why rows with an unstated placement, a plan kvtuner says does not fit and a bandwidth not called
#: measured are read as they are now (:func:`run_rows`, :func:`host_of`); reddit-3050-egpu-1360p's
#: decode workload is where the weight summary's MTP/NextN fallback was found
#: (kvtuner/core/speed/weights.py); the experts-on-CPU prefill rows of hardware-corner,
#: tanhaien-3060-5800x, castlen3-3060-e5-2666v3 and ik2199-a1000 were broken down (copy against
#: compute time) while the pageable copy rate and gpt-oss's measured expert share were added;
#: pl-rtx3060-r5-5600-qwen36's Vulkan prefill rows, 76-104 % high, and kat-coder-rx9070xt-i9-14900k's
#: page (its mmap remark) are why ggml-vulkan's staging of pageable copies was read and priced.
CONSULTED_SOURCES = frozenset(
    {
        "kratos-7800xt",
        "llmfit",
        "inventivehq",
        "carteakey-4070",
        "compiledthoughts-5060ti-9700x",
        "jordanfablefur-5090-285k",
        "reddit-3050-egpu-1360p",
        "hardware-corner",
        "tanhaien-3060-5800x",
        "castlen3-3060-e5-2666v3",
        "ik2199-a1000",
        "pl-rtx3060-r5-5600-qwen36",
        "kat-coder-rx9070xt-i9-14900k",
    }
)
#: The issue's bar on validation rows: median |error| per regime with at least 5 rows.
BAR = {"decode": 0.25, "prefill": 0.35}
BAR_MIN_ROWS = 5
#: Decode tokens a llama-server reply is assumed to have when the page does not say (the decode
#: is predicted at the prompt's depth plus half of it).
SERVER_REPLY_TOKENS = 256
#: Gigabytes of RAM per DIMM assumed when a server or workstation's channel count is not stated.
DIMM_GB = 16
#: Memory channels of CPU platforms named by the rows (vendor specifications: AMD EPYC 7003 and
#: 9004 series, Threadripper (PRO), Intel Xeon W-2200/W-3400, Core X-series i9-10900X: quad).
PLATFORM_CHANNELS = (
    (r"EPYC 9\d\d\d", 12),
    (r"EPYC [78]\d\d\d", 8),
    (r"Threadripper PRO", 8),
    (r"Threadripper", 4),
    (r"Xeon W-3\d\d\d", 8),
    (r"Xeon W-2\d\d\d", 4),
    (r"Xeon", 8),
    (r"i9-10\d\d\dX|i9-9\d\d\dX|i9-7\d\d\dX", 4),
)
#: Memory a CPU is rated for (vendor specifications: AMD product pages "Max. Memory Speed",
#: Intel ARK "Memory Types"), used when a page names the CPU but not its RAM: two channels on a
#: desktop platform, the platform's channels on a server, four 64-bit channels for the Ryzen AI
#: MAX's 256-bit LPDDR5X bus.
CPU_RATED_MEMORY = (
    (r"Ryzen \d 9\d\d\d", "DDR5-5600", 2),
    (r"Ryzen \d 7\d\d\d", "DDR5-5200", 2),
    (r"Ryzen \d 5\d\d\d", "DDR4-3200", 2),
    (r"Ryzen \d 2\d\d\d", "DDR4-2933", 2),
    (r"i\d-10\d\d\dH", "DDR4-2933", 2),
    (r"i\d-9\d\d\d", "DDR4-2666", 2),
    (r"i\d-8\d\d\d", "DDR4-2666", 2),
    (r"i\d-1[23]\d\d\d", "DDR5-4800", 2),
    (r"i\d-14\d\d\d", "DDR5-5600", 2),
    (r"Core Ultra \d 2\d\d", "DDR5-6400", 2),
    (r"EPYC 7[0-9A-Z]{2}[23]\b", "DDR4-3200", 8),
    (r"(?i)Ryzen AI MAX\+?(?: PRO)? 3\d\d", "LPDDR5X-8000", 4),
    (r"Xeon E5-26\d\d v4", "DDR4-2400", 4),
)
#: The GPU truth machine: 16 vCPUs of an "Intel(R) Xeon(R) Processor" (the VM hides the model;
#: AVX-512 BF16/VNNI and AMX flags: Sapphire Rapids or later) with 125.9 GiB RAM; its RAM is not
#: reported, so the platform's memory is assumed: Sapphire Rapids' eight channels of DDR5-4800
#: (Intel ARK, 4th Gen Xeon Scalable). PCIe: NVML reported gen 5 x16. Threads: the 16 the run used.
H200_HOST = {"memory": "DDR5-4800x8", "cores": 16, "pcie": (5, 16), "ram_gib": 125.9}


# ------------------------------------------------------------------------------------------
# model shapes


def _shapes() -> list[tuple[str, str, Callable]]:
    """(pattern on the normalised model name, shape note, builder of the F16 ModelSpec)."""
    from kvtuner.testing import gguf_factory as gf
    from kvtuner.testing import gguf_families as F

    def llama(name: str, **dims: int) -> Callable:
        return lambda: dataclasses.replace(gf.LLAMA31_8B, name=name, n_ctx_train=32768, **dims)

    def qwen3moe(name: str, **dims: int) -> Callable:
        return lambda: dataclasses.replace(gf.QWEN3_30B_A3B, name=name, **dims)

    hf = "config.json of "
    return [
        ("gpt-oss-20b", hf + "openai/gpt-oss-20b", F.gpt_oss),
        ("gpt-oss-120b", hf + "openai/gpt-oss-120b", lambda: F.gpt_oss(n_layer=36, n_expert=128, name="gpt-oss-120b")),
        (r"qwen3(-coder)?-30b-a3b", hf + "Qwen/Qwen3-30B-A3B", lambda: gf.QWEN3_30B_A3B),
        (
            r"qwen3-235b-a22b",
            hf + "Qwen/Qwen3-235B-A22B",
            qwen3moe(
                "Qwen3-235B-A22B shape",
                n_layer=94,
                n_embd=4096,
                n_head=64,
                n_head_kv=4,
                n_expert=128,
                n_expert_used=8,
                n_ff_exp=1536,
            ),
        ),
        (r"qwen3\.[56]-35b-a3b", hf + "Qwen/Qwen3.6-35B-A3B", F.qwen35moe),
        # the dense hybrid: 64 layers, every 4th full attention, 24 heads / 4 KV heads of 256
        (r"qwen3\.[56]-27b", hf + "Qwen/Qwen3.5-27B (gguf_families.qwen35)", F.qwen35),
        # Qwen3.8-27B: the same geometry as public code copies it from its config (vLLM-Omni's
        # kv_budget tests: 64 layers, 3 Gated DeltaNet to 1 full attention, 24 heads, 4 KV heads
        # of 256, hidden 5120, 16 key / 48 value linear heads of 128), and llama-bench labels the
        # file "qwen35 27B" with the 26.9 B parameters this shape has
        (
            r"qwen3\.8-27b(-abliterated)?",
            hf + "Qwen/Qwen3.8-27B as public code copies it (the qwen35 27B shape)",
            F.qwen35,
        ),
        # a fine-tune of Qwen3.5/3.6-35B-A3B (the row's family: qwen35moe), same shape
        (r"ornith-1\.5-35b-a3b", hf + "Qwen/Qwen3.6-35B-A3B (its base)", F.qwen35moe),
        (r"qwen3\.6-35b-a3b-uncensored-hauhaucs-aggressive", hf + "Qwen/Qwen3.6-35B-A3B (its base)", F.qwen35moe),
        # its page: "qwen35moe architecture", "40 layers, 256 experts, 8 active per token (plus
        # always-on shared expert)", "Gated DeltaNet + attention hybrid": the 35B-A3B shape
        (
            r"kwaipilot-kat-coder-v2\.5-dev",
            "the row's page (qwen35moe, 40 layers, 256 experts, 8 active) = " + hf + "Qwen/Qwen3.6-35B-A3B",
            F.qwen35moe,
        ),
        (
            r"glm-4\.5-air",
            hf + "zai-org/GLM-4.5-Air",
            lambda: F.glm4moe(
                n_layer=46,
                E=4096,
                n_head=96,
                n_head_kv=8,
                n_ff=10944,
                n_expert=128,
                n_expert_used=8,
                n_ff_exp=1408,
                V=151552,
                name="GLM-4.5-Air shape",
            ),
        ),
        (r"deepseek(-coder)?-v2-lite", hf + "deepseek-ai/DeepSeek-V2-Lite", F.deepseek2),
        ("llama-3.1-8b|llama-3-8b|meta-llama-3.1-8b", hf + "meta-llama/Llama-3.1-8B", lambda: gf.LLAMA31_8B),
        ("llama-2-7b", hf + "meta-llama/Llama-2-7b-hf", lambda: gf.LLAMA2_7B),
        (
            r"llama-3\.2-3b",
            hf + "meta-llama/Llama-3.2-3B",
            llama(
                "Llama-3.2-3B shape",
                n_layer=28,
                n_embd=3072,
                n_head=24,
                n_head_kv=8,
                n_ff=8192,
                n_vocab=128256,
                tied_output=True,
            ),
        ),
        (
            r"llama-3\.2-1b",
            hf + "meta-llama/Llama-3.2-1B",
            llama(
                "Llama-3.2-1B shape",
                n_layer=16,
                n_embd=2048,
                n_head=32,
                n_head_kv=8,
                head_dim=64,
                n_ff=8192,
                n_vocab=128256,
                tied_output=True,
            ),
        ),
        (
            r"llama-3\.[13]-70b",
            hf + "meta-llama/Llama-3.3-70B-Instruct",
            llama("Llama-3.3-70B shape", n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672, n_vocab=128256),
        ),
        (r"qwen2\.5(-coder|-math)?-7b|deepseek-r1-distill-qwen-7b", hf + "Qwen/Qwen2.5-7B", F.qwen2),
        (
            r"qwen2\.5(-coder)?-14b",
            hf + "Qwen/Qwen2.5-14B",
            lambda: F.qwen2(n_layer=48, E=5120, n_head=40, n_head_kv=8, n_ff=13824, V=152064, name="Qwen2.5-14B shape"),
        ),
        (r"qwen2\.5(-coder)?-32b", hf + "Qwen/Qwen2.5-Coder-32B", lambda: gf.QWEN25_CODER_32B),
        (r"qwen3-8b", hf + "Qwen/Qwen3-8B", F.qwen3),
        (
            r"qwen3-14b",
            hf + "Qwen/Qwen3-14B",
            lambda: F.qwen3(n_layer=40, E=5120, n_head=40, n_head_kv=8, n_ff=17408, name="Qwen3-14B shape"),
        ),
        (
            r"qwen3-32b",
            hf + "Qwen/Qwen3-32B",
            lambda: F.qwen3(n_layer=64, E=5120, n_head=64, n_head_kv=8, n_ff=25600, name="Qwen3-32B shape"),
        ),
        (
            r"gemma-4-26b-a4b(-uncensored)?",
            hf + "google/gemma-4-26b-a4b (gguf_families.gemma4_moe)",
            F.gemma4_moe,
        ),
        (r"gemma-3-12b", hf + "google/gemma-3-12b-it", lambda: gf.GEMMA3_12B),
        (
            r"gemma-3-27b",
            hf + "google/gemma-3-27b-it",
            lambda: dataclasses.replace(
                gf.GEMMA3_12B,
                n_layer=62,
                n_embd=5376,
                n_head=32,
                n_head_kv=16,
                head_dim=128,
                n_ff=21504,
                name="Gemma-3-27B shape",
            ),
        ),
        ("gemma-2-9b", hf + "google/gemma-2-9b", "real:gemma-2-9b"),
        (
            r"mistral-small-3(\.\d)?(-24b)?|mistral-small-24b",
            hf + "mistralai/Mistral-Small-24B-Instruct-2501",
            llama(
                "Mistral-Small-24B shape",
                n_layer=40,
                n_embd=5120,
                n_head=32,
                n_head_kv=8,
                head_dim=128,
                n_ff=32768,
                n_vocab=131072,
            ),
        ),
        ("mistral-7b", hf + "mistralai/Mistral-7B-v0.3", "real:mistral-7b-v0.3"),
        (r"olmoe-1b-7b(-0924)?", hf + "allenai/OLMoE-1B-7B-0924", "real:olmoe-1b-7b"),
        # phi-4: the phi3 architecture (fused QKV and gate+up), 40 layers, 5120 wide, 40 heads, 10 KV heads
        (r"(microsoft-)?phi-4(-14b)?", hf + "microsoft/phi-4", "phi4"),
    ]


#: Models whose fixtures this script cannot write, and why (pattern on the normalised name).
UNWRITABLE = (
    (r"gemma-4-12b", "Gemma 4 12B's shape is not in the fixtures (gguf_families.gemma4 is E4B's) nor on the row"),
    (r"qwythos-9b", "a 9B qwen35 fine-tune whose shape (layers, widths) is not stated"),
)


def normalise_model(name: str) -> str:
    """``"Qwen3-30B-A3B-Instruct-2507"`` -> ``"qwen3-30b-a3b"``: lower case, spaces as dashes, the
    release, instruct/chat/it suffixes and parenthesised notes dropped."""
    s = re.sub(r"\(.*?\)", "", name).strip().lower().replace(" ", "-").replace("_", "-")
    s = re.sub(r"-(instruct|chat|it|base|hf|thinking|\d{4})(?=-|$)", "", s)
    return s.strip("-")


def find_shape(row: dict) -> tuple[str, Callable | str] | None:
    """(shape note, builder) of a row's model, or None when no fixture writes it."""
    key = normalise_model(row.get("model") or "")
    for pattern, note, builder in _shapes():
        if re.fullmatch(pattern, key) or re.fullmatch(pattern, key.split("-gguf")[0]):
            return note, builder
    return None


def _phi4():
    from kvtuner.testing import gguf_factory as gf

    s = dataclasses.replace(
        gf.REAL_SHAPES["phi-3-mini-4k"],
        key="phi-4",
        n_layer=40,
        n_embd=5120,
        n_head=40,
        n_head_kv=10,
        n_ff=17920,
        n_vocab=100352,
        n_ctx_train=16384,
        source="https://huggingface.co/microsoft/phi-4/blob/main/config.json",
    )
    return s


def quant_name(quant: str) -> str:
    """``"UD-Q4_K_M"`` -> ``"Q4_K_M"``, ``"Q6_K (Q6_K_L file)"`` -> ``"Q6_K"``: the llama-quantize type."""
    return quant.split()[0].upper().removeprefix("UD-")


def quantize(tensors: list, quant: str, n_layer: int, family: str, tied: bool) -> list:
    """The F16 tensor table ``[(name, shape, type)]`` with the types llama-quantize gives for
    ``quant`` (src/llama-quant.cpp ``llama_tensor_get_type_impl``, main classes): the quant's base
    type for matrices; Q6_K for the output matrix (the token embedding when tied); in Q*_K_M,
    Q6_K for ``attn_v`` and ``ffn_down`` in the ``use_more_bits`` layers; llama-quantize's
    fallback for rows its block does not divide (``tensor_type_fallback``, as
    :func:`kvtuner.testing.gguf_factory.fallback_type`); gpt-oss's
    experts stay MXFP4 in every release (the ggml-org and unsloth files). Unsloth's dynamic quants
    (UD-*_XL) are priced as their base k-quant."""
    import gguf

    from kvtuner.testing.gguf_factory import _use_more_bits, fallback_type

    Q = gguf.GGMLQuantizationType
    q = quant_name(quant)
    base = {
        "F16": Q.F16,
        "BF16": Q.BF16,
        "Q8_0": Q.Q8_0,
        "Q6_K": Q.Q6_K,
        "Q5_K_M": Q.Q5_K,
        "Q5_K_S": Q.Q5_K,
        "Q5_K_XL": Q.Q5_K,
        "Q4_K_M": Q.Q4_K,
        "Q4_K_S": Q.Q4_K,
        "Q4_K_XL": Q.Q4_K,
        "Q4_0": Q.Q4_0,
        "IQ4_XS": Q.IQ4_XS,
        "IQ4_NL": Q.IQ4_NL,
        "Q3_K_M": Q.Q3_K,
        "Q3_K_XL": Q.Q3_K,
        "Q3_K_S": Q.Q3_K,
        "Q2_K": Q.Q2_K,
        "IQ3_XXS": Q.IQ3_XXS,
        "IQ3_S": Q.IQ3_S,
        "IQ3_M": Q.IQ3_S,
        "IQ2_XXS": Q.IQ2_XXS,
        "IQ2_XS": Q.IQ2_XS,
        "IQ2_S": Q.IQ2_S,
        "IQ2_M": Q.IQ2_S,
        "Q2_K_XL": Q.Q2_K,
        "MXFP4": Q.Q8_0,  # gpt-oss's MXFP4 file: Q8_0 matrices besides the experts (11.27 GiB as published)
        "MXFP4_MOE": Q.Q8_0,
    }.get(q)
    if base is None:
        raise ValueError(f"quant {quant} is not priced by this script")
    more_bits = q in ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q4_K_XL", "Q5_K_XL", "Q3_K_XL")
    out_name = "token_embd.weight" if tied else "output.weight"
    out = []
    counters = {"attn_v": 0, "ffn_down": 0}
    n_down = sum(1 for n, _, _ in tensors if ".ffn_down" in n and "shexp" not in n)
    for name, shape, t in tensors:
        if t not in (Q.F16, Q.BF16) or len(shape) == 1:
            out.append((name, shape, t))
            continue
        tt = base
        if "_exps." in name and (family == "gpt_oss" or q.startswith("MXFP4")):
            tt = Q.MXFP4
        elif name == out_name and base not in (Q.F16, Q.BF16, Q.Q8_0):
            tt = Q.Q6_K
        elif more_bits and ".attn_v." in name:
            tt = Q.Q6_K if _use_more_bits(counters["attn_v"], n_layer) else base
            counters["attn_v"] += 1
        elif more_bits and ".ffn_down" in name and "shexp" not in name:
            tt = Q.Q6_K if _use_more_bits(counters["ffn_down"] * n_layer // max(1, n_down), n_layer) else base
            counters["ffn_down"] += 1
        out.append((name, shape, fallback_type(tt, shape[0])))
    return out


def classify(row: dict) -> tuple[str | None, str]:
    """Without writing anything: ``(shape note, "")`` when the row's model maps to a fixture shape,
    else ``(None, why)`` (an :data:`UNWRITABLE` reason or "no fixture shape for ...")."""
    found = find_shape(row)
    if found is not None:
        return found[0], ""
    key = normalise_model(row.get("model") or "")
    return None, next((w for p, w in UNWRITABLE if re.match(p, key)), f"no fixture shape for {row.get('model')!r}")


def write_fixture(row: dict, directory: Path) -> tuple[Path | None, str, list[str]]:
    """(path, shape note, assumptions) of a row's model file, or (None, why, []) when skipped."""
    from kvtuner.testing import gguf_factory as gf

    found = find_shape(row)
    assumed: list[str] = []
    if found is None:
        return None, classify(row)[1], []
    note, builder = found
    quant = row.get("quant")
    if not quant:
        quant = "MXFP4" if row.get("family") == "gpt_oss" else "Q4_K_M"
        assumed.append(f"quant {quant}")
    key = re.sub(r"[^a-z0-9.]+", "-", f"{normalise_model(row['model'])}-{quant}".lower())
    path = directory / f"{key}.gguf"
    if path.exists():
        return path, note, assumed
    if isinstance(builder, str) and builder.startswith("real:"):
        ftype = quant_name(quant)
        if ftype not in gf.REAL_FTYPES:
            return None, f"the real-shape writer has no {ftype}", []
        gf.write_real_shape(path, builder[5:], ftype)
        return path, note, assumed
    if builder == "phi4":
        s = _phi4()
        try:
            gf.write_real_shape(path, s, quant_name(quant))
        except ValueError as exc:
            return None, str(exc), []
        return path, note, assumed
    spec = builder()
    tensors = gf._tensors(spec)
    try:
        rows = quantize(tensors, quant, spec.n_layer, row.get("family") or "", spec.tied_output)
    except ValueError as exc:
        return None, str(exc), []
    gf.write_model(path, dataclasses.replace(spec, tensors=rows, file_type=None, weight_type=gf.GQT.Q8_0))
    return path, note, assumed


# ------------------------------------------------------------------------------------------
# hosts and runs


def host_of(row: dict) -> tuple[dict, list[str]]:
    """The row's what-if host: ``{"memory": "DDR4-3200x2" | None, "bw_gbs": float | None,
    "cores": int, "pcie": (gen, lanes) | None, "name": str}`` and the assumptions made
    (module docstring). Raises ValueError when the page gives neither a memory type with its rate
    nor a measured bandwidth, or no thread or core count."""
    from kvtuner.core.hardware.memory_catalogue import parse_pcie_link

    assumed: list[str] = []
    ram = row.get("host_ram") or ""
    cpu = row.get("host_cpu") or ""
    bw = None
    m_bw = re.search(r"(\d+(?:\.\d+)?)\s*GB/s", ram)
    if m_bw:
        bw = float(m_bw.group(1))
        kind = re.search(RAM_TYPE, ram, re.I)
        if not re.search(r"measured", ram, re.I) and kind:
            # a figure the page does not call measured is the RAM's theoretical one (dual-channel
            # DDR5-6000 is "~96 GB/s"): its type's typical share of it is what a read reaches
            from kvtuner.core.hardware.memory_catalogue import MEMORY_TYPES

            eff = MEMORY_TYPES[kind.group(0).upper()].efficiency
            assumed.append(f"{bw:g} GB/s not called measured: theoretical, x {eff:g} ({kind.group(0).upper()})")
            bw *= eff
    m = re.search(rf"({RAM_TYPE})[- @]*(\d{{4,5}})", ram, re.I) or re.search(
        rf"({RAM_TYPE})\b.*?(\d{{4,5}})\s*MT/s", ram, re.I
    )
    memory = None
    if not m and not bw:
        for pattern, rated, n in CPU_RATED_MEMORY:
            if re.search(pattern, cpu):
                m = re.match(rf"({RAM_TYPE})-(\d+)", rated)
                stated = re.search(RAM_TYPE, ram, re.I)
                if stated and stated.group(0).upper() != m.group(1):
                    raise ValueError(f"the page's {stated.group(0)} is not the CPU's rated {rated}")
                row = {**row, "host_ram_channels": row.get("host_ram_channels") or n}
                assumed.append(f"RAM {'speed ' if stated else ''}not stated: the CPU's rated {rated}")
                break
    if m:
        ch = row.get("host_ram_channels")
        if not ch:
            ch = 2
            for pattern, n in PLATFORM_CHANNELS:
                if re.search(pattern, cpu, re.I):
                    cap = re.search(r"(\d+)\s*GB", ram)
                    ch = min(n, max(1, int(cap.group(1)) // DIMM_GB)) if cap else n
                    break
            assumed.append(f"{ch} channels")
        memory = f"{m.group(1).upper()}-{m.group(2)}x{int(ch)}"
    if memory is None and bw is None:
        raise ValueError(f"the host's RAM is not stated as TYPE-MT/s or GB/s ({ram!r})")
    cores = row.get("host_threads")
    if not cores:
        # llama.cpp's default -t: physical cores, without an Intel hybrid CPU's efficiency cores
        # (common/common.cpp common_cpu_get_num_math)
        # the CPU's line, else the collector's notes (a vendor specification the page did not give)
        notes = row.get("notes") or ""
        mc = next(
            (m for text in (cpu, notes) for p in (r"(\d+)C/\d+T", r"(\d+)P\s*\+\s*\d+E") if (m := re.search(p, text))),
            None,
        )
        if not mc:
            raise ValueError(f"neither threads nor the CPU's cores are stated ({cpu!r})")
        cores = int(mc.group(1))
        assumed.append(f"{cores} threads (the CPU's physical{' performance' if 'P' in mc.group(0) else ''} cores)")
    pcie = None
    if row.get("pcie"):
        # the link as the page words it: "3.0 x8", or a sentence naming "PCIe 3.0 x4"
        link = re.search(r"(?:PCIe\s*)?(\d)\.0\s*x\s*(\d{1,2})", str(row["pcie"]), re.I)
        try:
            pcie = parse_pcie_link(f"{link.group(1)}x{link.group(2)}" if link else str(row["pcie"]))
        except ValueError:
            assumed.append(f"PCIe {row['pcie']!r} not read: the card's own link")
    name = f"{memory or f'{bw:g} GB/s'}, {cores} cores" + (f", PCIe {pcie[0]}.0 x{pcie[1]}" if pcie else "")
    return {"memory": memory if bw is None else None, "bw_gbs": bw, "cores": int(cores), "pcie": pcie, "name": name}, (
        assumed
    )


def host_spec(h: dict, ram_bytes: int = 128 << 30):
    """A what-if :class:`HostSpec` for :func:`host_of`'s dict (as ``kvtuner plan --host-mem /
    --host-bw --host-cores --pcie`` builds it)."""
    from kvtuner.core.hardware.memory_catalogue import HostMemory, HostMemoryError, parse_host_memory
    from kvtuner.core.hardware.specs import HostSpec

    if h.get("memory"):
        try:
            mem = parse_host_memory(h["memory"])
        except HostMemoryError:  # a rate outside what the type is sold at (DDR5 run at 2000 MT/s)
            k, mt, ch = re.split(r"[-x]", h["memory"])
            mem = HostMemory(k, int(mt), int(ch))
        bw, theo, name = mem.typical_bytes_s, mem.theoretical_bytes_s, mem.name
    else:
        bw, theo, name = h["bw_gbs"] * 1e9, None, None
    return HostSpec(
        total_bytes=ram_bytes,
        available_bytes=ram_bytes,
        mem_bandwidth_bytes_s=bw,
        what_if=True,
        memory=name,
        mem_theoretical_bytes_s=theo,
        n_cores=h["cores"],
        pcie_link=h.get("pcie"),
    )


def gpu_of(row: dict):
    """The catalogue card of the row (its name, then its name with the memory size)."""
    from kvtuner.core.hardware.gpu_catalogue import UnknownGpuError
    from kvtuner.core.hardware.specs import catalogue_gpu

    name = re.sub(r"\s*\(.*?\)", "", row["gpu"]).strip()  # the page's notes in parentheses
    try:
        gpu = catalogue_gpu(name)
    except UnknownGpuError as exc:
        bare = re.sub(r"\s*\d+\s*GB\b", "", name)
        for name in (bare, f"{bare} {row.get('gpu_mem_gib')}GB"):
            try:
                gpu = catalogue_gpu(name)
                break
            except UnknownGpuError:
                pass
        else:
            raise ValueError(f"{row['gpu']} is not in kvtuner's GPU catalogue") from exc
    # the backend the row ran (a catalogue card is planned under its vendor's): ROCm and Vulkan rows as such
    backend = next((b for b in ("ROCm", "Vulkan") if (row.get("backend") or "").startswith(b)), None)
    return dataclasses.replace(gpu, backend=backend) if backend else gpu


def test_of(row: dict) -> tuple[str, int, int]:
    """(phase, tokens, depth): ``pp512`` -> ("prefill", 512, depth); ``tg128`` -> ("decode", 128,
    depth); ``pp512 @ d32768`` -> depth 32768; a server prompt of P tokens -> ("prefill", P, 0);
    a server decode after P tokens -> ("decode", SERVER_REPLY_TOKENS, P)."""
    t = (row.get("test") or "").strip()
    depth = int(row.get("depth") or 0)
    md = re.search(r"@\s*d(\d+)", t)
    if md:
        depth = int(md.group(1))
    m = re.match(r"(pp|tg)(\d+)", t)
    if m:
        return ("prefill" if m.group(1) == "pp" else "decode"), int(m.group(2)), depth
    if t.startswith("pp"):
        n = row.get("n_prompt")
        if not n:
            raise ValueError(f"prompt length not stated ({t!r})")
        return "prefill", int(n), depth
    if t.startswith("tg"):
        return "decode", int(row.get("n_gen") or SERVER_REPLY_TOKENS), depth + int(row.get("n_prompt") or 0)
    raise ValueError(f"test {t!r} is neither pp nor tg")


def config_of(row: dict, phase: str, n: int, depth: int):
    """The PlanConfig the row ran (llama-bench's defaults where the page is silent)."""
    from kvtuner.core.plan.config import ALL_LAYERS, PlanConfig

    ub = int(row.get("n_ubatch") or 512)
    nb = int(row.get("n_batch") or max(2048, ub))
    fa = row.get("flash_attn")
    ngl = row.get("ngl")
    ctx = depth + n + (0 if phase == "decode" else 1)
    return PlanConfig(
        n_ctx=max(512, -(-ctx // 256) * 256),
        n_gpu_layers=ALL_LAYERS if ngl is None or ngl >= 99 else int(ngl),
        kv_gpu_layers=0 if row.get("nkvo") else None,
        type_k=row.get("type_k") or "f16",
        type_v=row.get("type_v") or "f16",
        flash_attn="auto" if fa is None else ("on" if fa in (True, 1, "on", "1") else "off"),
        n_ubatch=min(ub, nb),
        n_batch=nb,
        n_cpu_moe=int(row.get("n_cpu_moe") or 0),
        cpu_moe=bool(row.get("cpu_moe")),
        tensor_overrides=tuple(x for x in re.split(r"[,\s]+", row.get("ot") or "") if x),
        # the row's "use_mmap": false where its command says -mmp 0, --no-mmap or -lm none (or the
        # mapping is pinned); else the tools' default, a memory-mapped model
        use_mmap=row.get("use_mmap") is not False,
    )


def predict(plan, inputs, phase: str, n: int, depth: int) -> float:
    """Prefill tokens/s of ``n`` tokens at ``depth``, or decode tokens/s averaged over ``n`` tokens."""
    from kvtuner.core.speed.speed_model import _assemble_decode, _decode_parts, prefill_tok_s, workload_time_s

    if phase == "prefill":
        return prefill_tok_s(plan, inputs, n, depth)
    parts = _decode_parts(plan)
    step = max(1, n // 16)  # the decode time is linear in depth: 16 points are the mean
    ds = list(range(depth, depth + n, step))
    return 1.0 / statistics.mean(workload_time_s(_assemble_decode(plan, parts, d), inputs) for d in ds)


def run_rows(rows: list[dict], directory: Path) -> list[dict]:
    """Each row with ``pred`` (tokens/s) or ``skip`` (why), ``host``, ``assumed``, ``phase``."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.plan.verdict import fit_verdict
    from kvtuner.core.speed.regime import placement_regime
    from kvtuner.core.speed.speed_model import speed_inputs

    out = []
    for r in rows:
        rec = dict(r)
        try:
            phase, n, depth = test_of(r)
            rec["phase"] = phase
            if r["regime"] == "experts_cpu" and not (r.get("n_cpu_moe") or r.get("cpu_moe") or r.get("ot")):
                rec["skip"] = "experts on the CPU, but the page does not say which (-ncmoe, --cpu-moe, -ot)"
                out.append(rec)
                continue
            path, note, assumed_m = write_fixture(r, directory)
            if path is None:
                rec["skip"] = note
                out.append(rec)
                continue
            h, assumed_h = host_of(r)
            gpu = gpu_of(r)
            host = host_spec(h)
            prof = ModelProfile.from_gguf(path)
            plan = plan_memory(prof, config_of(r, phase, n, depth), [gpu], host)
            if not fit_verdict(plan).loads:
                # kvtuner's answer for this configuration is "does not fit", not a speed
                rec["skip"] = (
                    f"kvtuner: does not fit ({plan.gpus[0].total_bytes / (1 << 30):.2f} GiB planned on the GPU)"
                )
                out.append(rec)
                continue
            inputs = speed_inputs([gpu], host, n_threads=h["cores"], measure=False)
            rec.update(
                pred=predict(plan, inputs, phase, n, depth),
                host_name=h["name"],
                assumed=assumed_m + assumed_h,
                fixture_gib=prof.file_bytes / (1 << 30),
                gpu_name=gpu.catalogue,
                vram_planned_gib=plan.gpus[0].total_bytes / (1 << 30),
                placement=placement_regime(plan),
            )
        except Exception as exc:
            rec["skip"] = f"{type(exc).__name__}: {exc}"
        out.append(rec)
    return out


# ------------------------------------------------------------------------------------------
# H200 re-prediction


def h200_rows(results: dict, directory: Path) -> list[dict]:
    """Every speed row of a GPU truth results JSON predicted for :data:`H200_HOST` and the H200
    of the catalogue: prefill of the row's prompt at its depth, decode averaged over its tokens."""
    from kvtuner.testing.scripts import load_script

    _fixture_path = load_script("benchmarks/gpu_truth/replan.py")._fixture_path

    from kvtuner.cli import build_parser
    from kvtuner.cli.args import config_from_args
    from kvtuner.core.hardware.specs import catalogue_gpu
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.speed_model import speed_inputs

    h = {"memory": H200_HOST["memory"], "cores": H200_HOST["cores"], "pcie": H200_HOST["pcie"]}
    host = host_spec(h, int(H200_HOST["ram_gib"] * (1 << 30)))
    gpu = catalogue_gpu("H200")
    out = []
    cache: dict[str, Path] = {}
    for s in results["speed"]:
        path = _fixture_path(s["fixture"], directory, cache)
        args = build_parser().parse_args(["plan", str(path), *s["flags"]])
        plan = plan_memory(ModelProfile.from_gguf(path), config_from_args(args), [gpu], host)
        inputs = speed_inputs([gpu], host, n_threads=h["cores"], measure=False)
        d0, npr, ng = int(s["n_depth"]), int(s["n_prompt"]), int(s["n_gen"])
        meas = s["measured"]
        then = s.get("predicted") or {}
        out.append(
            {
                "key": s["key"],
                "flags": " ".join(s["flags"]),
                "note": s.get("note", ""),
                "prefill_meas": meas["prefill_tok_s"],
                "prefill_pred": predict(plan, inputs, "prefill", npr, d0),
                "prefill_then": then.get("prefill_tok_s"),
                "decode_meas": meas["decode_tok_s"],
                "decode_pred": predict(plan, inputs, "decode", ng, d0 + npr),
                "decode_then": then.get("decode_tok_s"),
            }
        )
    return out


# ------------------------------------------------------------------------------------------
# report


def _median_abs(xs: list[float]) -> float | None:
    return statistics.median(abs(x) for x in xs) if xs else None


def summary(recs: list[dict]) -> dict:
    """``{(regime, set, phase): (n, median |error|)}`` over the predicted rows."""
    groups: dict = {}
    for r in recs:
        if "pred" not in r:
            continue
        err = r["pred"] / r["tps"] - 1
        groups.setdefault((r["regime"], r["set"], r["phase"]), []).append(err)
        if r["set"] == "validate" and r.get("source_key") not in CONSULTED_SOURCES:
            groups.setdefault((r["regime"], "validate*", r["phase"]), []).append(err)
    return {k: (len(v), _median_abs(v)) for k, v in sorted(groups.items())}


def leave_one_source_out(recs: list[dict]) -> list[tuple[str, str, int, float, list[tuple[str, int, float]]]]:
    """How much each barred verdict hangs on one source: per regime and phase with at least
    ``BAR_MIN_ROWS`` validation rows, ``(regime, phase, rows, median |error|, [(source, rows left,
    median |error| without that source)])``."""
    groups: dict = {}
    for r in recs:
        if "pred" in r and r["set"] == "validate":
            groups.setdefault((r["regime"], r["phase"]), []).append(
                (r.get("source_key") or "?", r["pred"] / r["tps"] - 1)
            )
    out = []
    for (regime, phase), v in sorted(groups.items()):
        if len(v) < BAR_MIN_ROWS:
            continue
        without = []
        for src in sorted({k for k, _ in v}):
            rest = [e for k, e in v if k != src]
            if rest:
                without.append((src, len(rest), _median_abs(rest)))
        out.append((regime, phase, len(v), _median_abs([e for _, e in v]), without))
    return out


def likely_ranges(recs: list[dict]) -> dict[str, dict[str, tuple[int, float | None, float | None]]]:
    """The likely ranges of kvtuner's offload regimes: per regime of
    :func:`kvtuner.core.speed.regime.placement_regime` and phase, ``(rows, low, high)`` over the
    validation rows (long-depth rows, whose error mixes in the depth, left out), ``low`` and
    ``high`` being :func:`kvtuner.core.speed.regime.percentile_range` of their
    ``ln(measured / predicted)``, rounded to 3 places; None for both with under
    ``RANGE_MIN_ROWS`` rows. :data:`kvtuner.core.speed.regime.REGIME_RANGE_LOG` holds the ranges."""
    from kvtuner.core.speed.regime import OFFLOAD_REGIMES, RANGE_MIN_ROWS, percentile_range

    groups: dict[tuple[str, str], list[float]] = {}
    for r in recs:
        if "pred" in r and r["set"] == "validate" and r["regime"] != "long_depth" and r["placement"] in OFFLOAD_REGIMES:
            groups.setdefault((r["placement"], r["phase"]), []).append(math.log(r["tps"] / r["pred"]))
    out: dict[str, dict[str, tuple[int, float | None, float | None]]] = {}
    for regime in OFFLOAD_REGIMES:
        for phase in ("decode", "prefill"):
            errs = groups.get((regime, phase), [])
            if len(errs) >= RANGE_MIN_ROWS:
                lo, hi = percentile_range(errs)
                out.setdefault(regime, {})[phase] = (len(errs), round(lo, 3), round(hi, 3))
            elif errs:
                out.setdefault(regime, {})[phase] = (len(errs), None, None)
    return out


def range_log_literal(ranges: dict[str, dict[str, tuple[int, float | None, float | None]]]) -> dict:
    """The ``REGIME_RANGE_LOG`` that :func:`likely_ranges` makes (the ranges with enough rows)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for regime, v in ranges.items():
        for phase, (_, lo, hi) in v.items():
            if lo is not None and hi is not None:
                out.setdefault(regime, {})[phase] = (lo, hi)
    return out


def print_likely_ranges(recs: list[dict], markdown: bool) -> None:
    """Print :func:`likely_ranges` and the ``REGIME_RANGE_LOG`` literal they make."""
    from kvtuner.core.speed.regime import RANGE_MIN_ROWS, RANGE_PERCENTILES

    ranges = likely_ranges(recs)
    p_lo, p_hi = (100 * p for p in RANGE_PERCENTILES)

    def cell(v: tuple[int, float | None, float | None]) -> str:
        n, lo, hi = v
        return (
            f"too few ({n} rows)" if lo is None or hi is None else f"{math.exp(lo):.2f}-{math.exp(hi):.2f}x ({n} rows)"
        )

    print("\nLikely range per placement regime: measured / predicted of about the central two thirds of")
    print(f"the validation rows ({p_lo:.2f}th-{p_hi:.2f}th percentile, nearest rank; {RANGE_MIN_ROWS} rows or more)")
    for regime, v in ranges.items():
        print(f"{regime:12s} " + "  ".join(f"{ph} {cell(x)}" for ph, x in v.items()))
    print(f"REGIME_RANGE_LOG = {range_log_literal(ranges)}")
    if markdown:
        print(
            "\n| regime | decode: measured / predicted (rows) | prefill: measured / predicted (rows) |\n|---|---|---|"
        )
        for regime, v in ranges.items():
            print(f"| {regime} | " + " | ".join(cell(v[ph]) if ph in v else "-" for ph in ("decode", "prefill")) + " |")


def print_leave_one_source_out(recs: list[dict], markdown: bool) -> None:
    """The validation medians with each source left out in turn; a source whose absence moves the
    median across the bar is marked."""
    print("\nLeave one source out (validation rows; median |error| without the source, rows left; * = across the bar)")
    lines = []
    for regime, phase, n, med, without in leave_one_source_out(recs):
        bar = BAR[phase]
        cells = [f"{src} {m:.1%} ({k}){' *' if (m <= bar) != (med <= bar) else ''}" for src, k, m in without]
        print(f"{regime:12s} {phase:7s} all {med:.1%} ({n}): " + "; ".join(cells))
        lines.append((regime, phase, f"{med:.1%} ({n})", "; ".join(cells)))
    if markdown:
        print("\n| regime | phase | all validation rows | without one source (* = the verdict flips) |")
        print("|---|---|---:|---|")
        for row in lines:
            print("| " + " | ".join(row) + " |")


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_report(recs: list[dict], markdown: bool) -> None:
    s = summary(recs)
    sources: dict = {}
    for r in recs:
        if "pred" in r:
            sources.setdefault((r["regime"], r["set"]), set()).add(r.get("source_key") or "?")
            if r["set"] == "validate" and r.get("source_key") not in CONSULTED_SOURCES:
                sources.setdefault((r["regime"], "validate*"), set()).add(r.get("source_key") or "?")
    print("\nMedian |predicted / measured - 1| per regime and set (rows); bar on validation rows: decode <= 25%,")
    print("prefill <= 35% where a regime has >= 5 rows. validate* = validate without the sources consulted while")
    print(f"changing the model or the rules ({', '.join(sorted(CONSULTED_SOURCES))})")
    hdr = f"{'regime':12s} {'set':10s} {'decode':>20s} {'prefill':>20s}  sources"
    print(hdr + "\n" + "-" * len(hdr))
    table = []

    def cell(x: tuple | None, set_: str, phase: str) -> str:
        if not x:
            return "-"
        mark = ""
        if set_.startswith("validate") and x[0] >= BAR_MIN_ROWS:
            mark = " meets" if x[1] <= BAR[phase] else " MISSES"
        return f"{x[1]:.1%} ({x[0]}){mark}"

    for regime in REGIMES:
        for set_ in (*SETS, "validate*"):
            d = s.get((regime, set_, "decode"))
            p = s.get((regime, set_, "prefill"))
            if not d and not p:
                continue
            src = ", ".join(sorted(sources.get((regime, set_), ())))
            row = (regime, set_, cell(d, set_, "decode"), cell(p, set_, "prefill"), src)
            table.append(row)
            print(f"{regime:12s} {set_:10s} {row[2]:>20s} {row[3]:>20s}  {src}")
    print("\nRows (tokens/s; error = predicted / measured - 1)")
    for r in recs:
        if "pred" in r:
            err = r["pred"] / r["tps"] - 1
            print(
                f"{r['id']:42s} {r['set']:9s} {r['regime']:12s} {r['phase']:7s} meas {r['tps']:9.2f} pred "
                f"{r['pred']:9.2f} {err:+7.1%}  [{r['host_name']}; fixture {r['fixture_gib']:.2f} GiB"
                f"{'; assumed ' + ', '.join(r['assumed']) if r['assumed'] else ''}]"
            )
    skipped = [r for r in recs if "skip" in r]
    if skipped:
        print("\nSkipped rows")
        for r in skipped:
            print(f"{r['id']:42s} {r['set']:9s} {r['regime']:12s} {r['skip']}")
    if markdown:
        print("\n| regime | set | decode median \\|error\\| (rows) | prefill median \\|error\\| (rows) | sources |")
        print("|---|---|---:|---:|---|")
        for row in table:
            print("| " + " | ".join(row) + " |")
        print(
            "\n| row | set | regime | GPU | host (as predicted) | model | flags | test | measured | predicted | error |"
        )
        print("|---|---|---|---|---|---|---|---|---:|---:|---:|")
        for r in recs:
            flags = []
            if r.get("ngl") is not None:
                flags.append(f"-ngl {r['ngl']}")
            if r.get("n_cpu_moe"):
                flags.append(f"--n-cpu-moe {r['n_cpu_moe']}")
            if r.get("ot"):
                flags.append(f"-ot {r['ot']}")
            if r.get("nkvo"):
                flags.append("-nkvo")
            if r.get("n_ubatch"):
                flags.append(f"-ub {r['n_ubatch']}")
            if "pred" in r:
                err = r["pred"] / r["tps"] - 1
                host = r["host_name"] + (f" (assumed {', '.join(r['assumed'])})" if r["assumed"] else "")
                cells = [f"{r['pred']:.2f}", f"{err:+.0%}"]
            else:
                host, cells = r.get("host_cpu") or "", ["skipped", r["skip"]]
            cols = [r["id"], r["set"], r["regime"], r["gpu"], host, f"{r['model']} {r.get('quant') or ''}".strip()]
            cols += [" ".join(flags), r["test"], f"{r['tps']:g}", *cells]
            print("| " + " | ".join(str(c).replace("|", "\\|") for c in cols) + " |")


def print_h200(rows: list[dict], markdown: bool) -> None:
    h = H200_HOST
    print(
        f"\nH200 GPU truth rows re-predicted (host: {h['memory']} assumed, {h['cores']} cores, "
        f"PCIe {h['pcie'][0]}.0 x{h['pcie'][1]}; tokens/s; 'then' = the prediction recorded in the run)"
    )
    hdr = (
        f"{'row':18s} {'prefill meas':>12s} {'pred':>9s} {'p/m':>6s} {'then p/m':>8s} | "
        f"{'decode meas':>11s} {'pred':>8s} {'p/m':>6s} {'then p/m':>8s}"
    )
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        pt = r["prefill_then"] / r["prefill_meas"] if r["prefill_then"] else None
        print(
            f"{r['key']:18s} {r['prefill_meas']:12.1f} {r['prefill_pred']:9.1f} {r['prefill_pred'] / r['prefill_meas']:6.3f} "
            f"{_fmt(pt, '8.3f')} | {r['decode_meas']:11.1f} {r['decode_pred']:8.1f} "
            f"{r['decode_pred'] / r['decode_meas']:6.3f} {r['decode_then'] / r['decode_meas']:8.3f}"
        )
    for ph in ("prefill", "decode"):
        errs = [r[f"{ph}_pred"] / r[f"{ph}_meas"] - 1 for r in rows]
        print(f"  {ph}: median |error| {_median_abs(errs):.1%} over {len(errs)} rows")
    if markdown:
        print(
            "\n| row | flags | prefill measured | predicted | pred/meas | decode measured | predicted | pred/meas | decode pred/meas on 2026-11-30 |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['key']} | `{r['flags']}` | {r['prefill_meas']:.0f} | {r['prefill_pred']:.0f} | "
                f"{r['prefill_pred'] / r['prefill_meas']:.2f} | {r['decode_meas']:.1f} | {r['decode_pred']:.1f} | "
                f"{r['decode_pred'] / r['decode_meas']:.2f} | {r['decode_then'] / r['decode_meas']:.2f} |"
            )


def load_rows(path: Path = ROWS) -> list[dict]:
    """The rows of an offload rows file, checked: each has an id, a set of :data:`SETS`, a regime
    of :data:`REGIMES`, a GPU, a model, a test and a measured tokens/s > 0.

    Raises:
        ValueError: a row without one of those (the message names it).
    """
    doc = json.loads(Path(path).read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    seen = set()
    for r in rows:
        rid = r.get("id")
        if not rid or rid in seen:
            raise ValueError(f"row without a unique id: {rid!r}")
        seen.add(rid)
        if r.get("set") not in SETS or r.get("regime") not in REGIMES:
            raise ValueError(f"{rid}: set {r.get('set')!r} / regime {r.get('regime')!r} unknown")
        if not r.get("gpu") or not r.get("model") or not r.get("test"):
            raise ValueError(f"{rid}: gpu, model and test are required")
        if not isinstance(r.get("tps"), (int, float)) or r["tps"] <= 0:
            raise ValueError(f"{rid}: tps must be > 0")
    return rows


def load_all_rows(paths: list[Path]) -> list[dict]:
    """The rows of several rows files (:func:`load_rows`), ids unique across them; the ``more``
    file's rows may only be ``validate`` or ``reference`` (it was collected after the model's
    fitting was done).

    Raises:
        ValueError: an id repeated across files, or a ``fit`` row in the ``more`` file.
    """
    rows: list[dict] = []
    seen: set[str] = set()
    for path in paths:
        for r in load_rows(path):
            if r["id"] in seen:
                raise ValueError(f"row id {r['id']!r} is in two rows files")
            if Path(path).name == ROWS_MORE.name and r["set"] == "fit":
                raise ValueError(f"{r['id']}: {ROWS_MORE.name} holds validation rows only")
            seen.add(r["id"])
            rows.append(r)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--rows",
        nargs="+",
        default=[str(ROWS)] + ([str(ROWS_MORE)] if ROWS_MORE.is_file() else []),
        help="the rows files (default benchmarks/offload_public_rows.json and offload_public_rows_more.json)",
    )
    ap.add_argument("--sets", default="fit,validate,reference", help="which sets to predict and print")
    ap.add_argument("--markdown", action="store_true", help="also print the Markdown tables for the docs")
    ap.add_argument("--h200", action="store_true", help="re-predict the H200 GPU truth rows")
    ap.add_argument("--no-public", action="store_true", help="only --h200")
    ap.add_argument("--models-dir", default=None, help="where the zero-weight fixtures go (default: a temp dir)")
    a = ap.parse_args(argv)
    directory = Path(a.models_dir or tempfile.mkdtemp(prefix="kvtuner-offload-"))
    directory.mkdir(parents=True, exist_ok=True)
    if not a.no_public:
        sets = tuple(x for x in a.sets.split(",") if x in SETS)
        rows = [r for r in load_all_rows([Path(x) for x in a.rows]) if r["set"] in sets]
        recs = run_rows(rows, directory)
        print_report(recs, a.markdown)
        print_leave_one_source_out(recs, a.markdown)
        if "validate" in sets:
            print_likely_ranges(recs, a.markdown)
    if a.h200:
        print_h200(h200_rows(json.loads(H200_RESULTS.read_text()), directory), a.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
