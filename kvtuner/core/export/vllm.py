"""vLLM: a ``vllm serve`` command line and the Python ``LLM(...)`` keyword arguments for a plan,
with the KV blocks and maximum concurrency vLLM will log (:mod:`kvtuner.core.plan.vllm`).

Flag spellings from vLLM's ``vllm/engine/arg_utils.py`` ``EngineArgs.add_cli_args`` (v0.6 -
v0.11): ``--max-model-len``, ``--gpu-memory-utilization``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--kv-cache-dtype``, ``--block-size``, ``--enable-prefix-caching``
/ ``--no-enable-prefix-caching``, ``--enforce-eager``; the ``LLM`` keyword arguments are the same
names with underscores (``vllm/entrypoints/llm.py``, ``**kwargs`` passed to ``EngineArgs``).

From a llama.cpp plan: the per-sequence window (``n_ctx / n_seq``) becomes ``--max-model-len``,
``-np`` becomes ``--max-num-seqs``, a quantized K/V cache becomes ``--kv-cache-dtype fp8``
(:data:`~kvtuner.core.plan.vllm.LLAMA_TO_VLLM_KV`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..plan.config import PlanConfig
from ..plan.vllm import LLAMA_TO_VLLM_KV, VllmModel, VllmPlan, VllmSettings, plan_vllm
from ..units import GiB
from ._common import ExportResult, safe_stem


def settings_from_config(config: PlanConfig, **overrides: object) -> VllmSettings:
    """vLLM settings for a llama.cpp configuration: ``max_model_len = n_ctx / n_seq`` (llama.cpp's
    per-sequence window, ``n_ctx_seq``), ``max_num_seqs = n_seq`` and the KV dtype of
    :data:`LLAMA_TO_VLLM_KV` (fp8 only when both K and V are quantized); ``overrides`` (non-None) win.

    Raises:
        VllmError: an override vLLM would refuse.
    """
    mapped = {LLAMA_TO_VLLM_KV.get(t, "auto") for t in (config.type_k, config.type_v)}
    kv = "float32" if "float32" in mapped else ("fp8" if mapped == {"fp8"} else "auto")
    values: dict = {
        "max_model_len": max(config.n_ctx // config.n_seq, 1),
        "max_num_seqs": config.n_seq,
        "kv_cache_dtype": kv,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return VllmSettings(**values)


def _args(settings: VllmSettings) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [
        ("max_model_len", settings.max_model_len),
        ("gpu_memory_utilization", settings.gpu_memory_utilization),
        ("max_num_seqs", settings.max_num_seqs),
    ]
    if settings.max_num_batched_tokens is not None:
        out.append(("max_num_batched_tokens", settings.max_num_batched_tokens))
    if settings.kv_cache_dtype != "auto":
        out.append(("kv_cache_dtype", settings.kv_cache_dtype))
    if settings.block_size != 16:
        out.append(("block_size", settings.block_size))
    out.append(("enable_prefix_caching", settings.enable_prefix_caching))
    if settings.enforce_eager:
        out.append(("enforce_eager", True))
    return out


def render(
    model_ref: str,
    model: VllmModel,
    config: PlanConfig,
    settings: VllmSettings,
    total_bytes: int | None = None,
    weights_bytes: int | None = None,
    gpu_name: str = "",
) -> ExportResult:
    """The ``vllm serve`` line, the ``LLM(...)`` kwargs and, given the card's memory as PyTorch
    reports it (``total_bytes``), the blocks and concurrency vLLM will log.

    Args:
        model_ref: what vLLM loads (an HF repo id or a local directory).
        model: the model's fields.
        config: the llama.cpp configuration the export starts from (for the limitations).
        settings: the vLLM settings (:func:`settings_from_config`).
        total_bytes: the GPU's memory, or None to leave out the prediction.
        weights_bytes: the weights as vLLM holds them when not ``n_params x 2`` (a GPTQ/AWQ/FP8
            checkpoint); None: :attr:`VllmModel.weights_bytes`.
        gpu_name: the card's name (vLLM's default batch size depends on it).
    """
    argv: list[str] = ["vllm", "serve", model_ref]
    kwargs: list[str] = [f"model={model_ref!r}"]
    for name, value in _args(settings):
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
        kwargs.append(f"{name}={value!r}")
    lines = [shlex.join(argv), "", "# Python:", "# from vllm import LLM", f"# llm = LLM({', '.join(kwargs)})"]
    plan: VllmPlan | None = None
    if total_bytes:
        plan = plan_vllm(model, settings, total_bytes, weights_bytes=weights_bytes, gpu_name=gpu_name)
        lines += [
            "",
            f"# kvtuner's prediction for a {total_bytes / GiB:.2f} GiB GPU "
            f"(utilization {settings.gpu_memory_utilization}):",
        ]
        if plan.unknown:
            lines += [
                f"#   weights {plan.weights_bytes / GiB:.2f} GiB, activation peak unknown, "
                f"non-torch {plan.non_torch_bytes / GiB:.2f} GiB",
                f"#   # GPU blocks: unknown ({plan.unknown})",
                "#   GPU KV cache size: unknown",
                f"#   Maximum concurrency for {settings.max_model_len:,} tokens per request: unknown",
            ]
        else:
            lines += [
                f"#   weights {plan.weights_bytes / GiB:.2f} GiB, activation peak {plan.activation_bytes / GiB:.2f} GiB "
                f"(estimated at {plan.batched_tokens} tokens), non-torch {plan.non_torch_bytes / GiB:.2f} GiB",
                f"#   KV cache {plan.available_kv_bytes / GiB:.2f} GiB = {plan.num_blocks} blocks of "  # type: ignore[operator]
                f"{settings.block_size} tokens ({plan.block_bytes / (1 << 20):.2f} MiB each)",
                f"#   # GPU blocks: {plan.num_blocks}",
                f"#   GPU KV cache size: {plan.kv_tokens:,} tokens",
                f"#   Maximum concurrency for {settings.max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x",
            ]
        if plan.fits is False:
            lines.append(
                f"#   vLLM will refuse to start: max_model_len {settings.max_model_len} > {plan.kv_tokens} KV tokens"
            )
    limits = [
        "vLLM loads the original (safetensors) checkpoint or its own quantizations (AWQ, GPTQ, FP8); "
        "llama.cpp's GGUF k-quant weights are not what it holds: weights are planned at "
        + (
            f"the GPTQ {model.gptq.bits}-bit tensors of config.json's quantization_config "
            f"({model.weights_bytes / GiB:.2f} GiB)"
            if weights_bytes is None and model.gptq is not None
            else "2 bytes per parameter (--weight-bits for a quantized checkpoint)"
            if weights_bytes is None
            else f"{weights_bytes / GiB:.2f} GiB (--weight-bits)"
        ),
        "vLLM keeps every layer's KV on the GPU: per-layer KV placement (-ngl below all, --kv-gpu-layers, -nkvo) "
        "and CPU layers have no equivalent"
        if (config.n_gpu_layers >= 0 or config.kv_gpu_layers is not None)
        else "",
        f"llama.cpp's {config.type_k}/{config.type_v} KV becomes --kv-cache-dtype {settings.kv_cache_dtype} "
        "(vLLM has fp8 for K and V together, no q4/q5 KV)"
        if (config.type_k, config.type_v) != ("f16", "f16")
        else "",
        "-ub / -b / flash attention / --swa-full are llama.cpp's: vLLM picks its attention backend and sizes "
        "its profiling pass by --max-num-batched-tokens",
        "vLLM adds paged KV blocks shared by all requests (like --kv-unified) and automatic prefix caching, "
        "which stores a shared prompt prefix's full 16-token blocks once",
        *(plan.notes if plan else ()),
    ]
    warnings = []
    if config.n_cpu_moe or config.cpu_moe or config.n_cpu_ffn or config.tensor_overrides:
        warnings.append(
            "vLLM cannot express this placement: it keeps every tensor on the GPU (no --n-cpu-moe / "
            "--cpu-moe / --n-cpu-ffn / -ot); "
            + (
                "the vLLM plan in the exported text says whether the whole model fits"
                if plan is not None
                else "give the card (--gpu / --gpu-mem) to check whether the whole model fits"
            )
        )
    if plan is not None and plan.fits is False:
        warnings.append(
            f"vLLM will refuse to start on this card: max_model_len {settings.max_model_len} > "
            f"{plan.kv_tokens} KV tokens"
        )
    stem = safe_stem(Path(model_ref.rstrip("/").split("/")[-1] or "model"))
    return ExportResult(
        "vllm",
        "\n".join(lines) + "\n",
        f"{stem}.vllm.sh",
        tuple(x for x in limits if x),
        tuple(argv),
        warnings=tuple(warnings),
    )
