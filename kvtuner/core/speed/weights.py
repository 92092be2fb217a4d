"""What the weights of a model are made of, for the speed model: per repeating layer and for the
output matrix, the bytes and parameters of each ggml tensor type, and which of them are MoE
experts -- read from the GGUF tensor table (:func:`kvtuner.core.model.gguf_header.read_header`),
since kernels run at a speed of their own per type (a Q4_K_M file mixes Q4_K and Q6_K tensors)
and a MoE token reads only its experts.

Which tensors a token reads (llama.cpp's graphs, src/models/*.cpp):

- every 2-D weight of a layer once per token (``ggml_mul_mat``), biases and norms too;
- of the expert tensors (``*_exps``, 3-D: ``[n_embd, n_ff_exp, n_expert]``), a token reads
  ``n_expert_used`` of ``n_expert`` slices (``ggml_mul_mat_id`` over the selected experts,
  src/llama-graph.cpp ``build_moe_ffn``); a ubatch of ``u`` tokens reads the union of its tokens'
  experts, ``n_expert * (1 - (1 - n_expert_used / n_expert) ** u)`` in expectation for
  independent uniform routing, and for gpt-oss no more than the share llama.cpp measured
  (:data:`GPT_OSS_ROUTED_SHARE`);
- the input embedding one row per token (``ggml_get_rows``: not counted);
- the output matrix once per token that needs logits (decode: 1; a prompt: its last token,
  ``llama_batch_get_one`` asks for the last token's logits only).

When the file cannot be read (moved, or a profile built without one) the summary falls back to
the profile's per-layer bytes with the file type's main tensor type (:func:`summary_from_profile`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass

import gguf

from ..model.gguf_header import GGUFError, read_header
from ..model.profile import ModelProfile
from .expert_shapes import expert_keys_of

_BLK = re.compile(r"^blk\.(\d+)\.")
#: Measured share of a layer's experts a ubatch of gpt-oss uses, by ubatch tokens:
#: ``((tokens, share), ...)``. In llama.cpp PR #15346 (the change that copies only the used experts,
#: ggml-backend.cpp ``ggml_backend_sched_compute_splits``) gpt-oss-20b with every expert on the CPU
#: took 0.61, 0.68, 0.73, 0.86 and 0.78 of the time of copying all of them at ubatches of 128 to
#: 2048 tokens (llama-bench pp2048, random tokens), where uniform routing of 32 experts, 4 per
#: token, uses all of them from about 40 tokens on. Each ratio is an upper bound of the share (it
#: counts the GPU's compute too), and a bound at more tokens holds at fewer (fewer tokens use no
#: more experts), so each entry is the least of its own and the later ratios: 1024 takes 2048's
#: 0.78. ``benchmarks/routing_fit.py`` prints them from ``benchmarks/routing_public_rows.json``.
#: Other architectures route uniformly here: ik_llama.cpp's author, who built the same copy, found
#: "for many models ... basically all experts are active" at batches that offload, gpt-oss being
#: the exception (ik_llama.cpp PR #698).
GPT_OSS_ROUTED_SHARE: tuple[tuple[int, float], ...] = (
    (128, 0.61),
    (256, 0.68),
    (512, 0.73),
    (1024, 0.78),
    (2048, 0.78),
)
#: Architectures :data:`GPT_OSS_ROUTED_SHARE` was measured on (the GGUF ``general.architecture``).
ROUTED_SHARE_ARCHITECTURES = frozenset({"gpt-oss"})


def routed_share(table: tuple[tuple[int, float], ...], n_tokens: int) -> float:
    """The measured share of ``table`` at ``n_tokens``: linear in log2(tokens) between its points,
    its first share below them and its last above (dimensionless, 0-1)."""
    if n_tokens <= table[0][0]:
        return table[0][1]
    for (u0, s0), (u1, s1) in zip(table, table[1:]):
        if n_tokens <= u1:
            x = (math.log2(n_tokens) - math.log2(u0)) / (math.log2(u1) - math.log2(u0))
            return s0 + (s1 - s0) * x
    return table[-1][1]


#: The tensor type most of a file type's weights have (llama-quantize's default type per file
#: type, src/llama-quant.cpp ``llama_ftype_get_default_type``); used only without a tensor table.
FILE_TYPE_MAIN: dict[str, str] = {
    "ALL_F32": "F32",
    "MOSTLY_F16": "F16",
    "MOSTLY_BF16": "BF16",
    "MOSTLY_Q8_0": "Q8_0",
    "MOSTLY_Q4_0": "Q4_0",
    "MOSTLY_Q4_1": "Q4_1",
    "MOSTLY_Q5_0": "Q5_0",
    "MOSTLY_Q5_1": "Q5_1",
    "MOSTLY_Q2_K": "Q2_K",
    "MOSTLY_Q2_K_S": "Q2_K",
    "MOSTLY_Q3_K_S": "Q3_K",
    "MOSTLY_Q3_K_M": "Q3_K",
    "MOSTLY_Q3_K_L": "Q3_K",
    "MOSTLY_Q4_K_S": "Q4_K",
    "MOSTLY_Q4_K_M": "Q4_K",
    "MOSTLY_Q5_K_S": "Q5_K",
    "MOSTLY_Q5_K_M": "Q5_K",
    "MOSTLY_Q6_K": "Q6_K",
    "MOSTLY_IQ4_NL": "IQ4_NL",
    "MOSTLY_IQ4_XS": "IQ4_XS",
    "MOSTLY_MXFP4_MOE": "MXFP4",
}


@dataclass(frozen=True)
class TypedWeights:
    """Weights of one ggml type in one place: ``bytes_`` and ``params`` (elements); ``expert``: True
    for MoE expert tensors (read ``n_expert_used / n_expert`` of per token)."""

    ggml_type: str
    bytes_: int
    params: int
    expert: bool = False


@dataclass(frozen=True)
class WeightSummary:
    """The weights of a model by type: ``layers[il]`` for repeating layer ``il``, ``output`` for
    the output matrix and norm (the duplicated ``token_embd`` when tied), ``n_expert`` and
    ``n_expert_used`` (0 for dense), ``source``: ``"tensor table"`` or ``"profile estimate"``,
    ``expert_keys``: per layer the shape of its experts
    (:func:`kvtuner.core.speed.expert_shapes.expert_key`, None without; empty for a profile estimate);
    ``routed``: a measured ``((tokens, share), ...)`` of the experts a ubatch uses
    (:data:`GPT_OSS_ROUTED_SHARE`), empty for uniform routing."""

    layers: tuple[tuple[TypedWeights, ...], ...]
    output: tuple[TypedWeights, ...]
    n_expert: int = 0
    n_expert_used: int = 0
    source: str = "tensor table"
    expert_keys: tuple[str | None, ...] = ()
    routed: tuple[tuple[int, float], ...] = ()

    def expert_key(self, il: int) -> str | None:
        """The expert shape of layer ``il`` (None: no experts, or not known)."""
        return self.expert_keys[il] if 0 <= il < len(self.expert_keys) else None

    def types(self) -> dict[str, int]:
        """Bytes per ggml type over the layers and the output matrix."""
        out: dict[str, int] = {}
        for group in (*self.layers, self.output):
            for w in group:
                out[w.ggml_type] = out.get(w.ggml_type, 0) + w.bytes_
        return out

    def expert_share(self, n_tokens: int = 1) -> float:
        """Share of the expert weights a batch of ``n_tokens`` reads (1 for dense models): for
        uniform routing ``1 - (1 - k / n) ** n_tokens`` (``k / n``: ``n_expert_used / n_expert``),
        and where a measured share exists (``routed``) no more than it (:func:`routed_share`)."""
        if not self.n_expert or not self.n_expert_used:
            return 1.0
        p = min(1.0, self.n_expert_used / self.n_expert)
        uniform = 1.0 - (1.0 - p) ** max(1, n_tokens)
        return min(uniform, routed_share(self.routed, n_tokens)) if self.routed else uniform

    def active_fraction(self) -> float:
        """Share of one token's expert compute over the expert weights: ``n_expert_used / n_expert``."""
        if not self.n_expert or not self.n_expert_used:
            return 1.0
        return min(1.0, self.n_expert_used / self.n_expert)


def _type_name(t: int) -> str:
    try:
        return gguf.GGMLQuantizationType(t).name
    except ValueError:
        return f"type{t}"


def _group(items: dict[tuple[str, bool], list[int]]) -> tuple[TypedWeights, ...]:
    return tuple(TypedWeights(t, b, p, e) for (t, e), (b, p) in sorted(items.items()))


@functools.lru_cache(maxsize=16)
def _summary_cached(
    paths: tuple[str, ...],
    header_sha256: str,
    n_layer: int,
    n_expert: int,
    n_expert_used: int,
    skipped: tuple[bool, ...] = (),
) -> WeightSummary:
    layers: list[dict[tuple[str, bool], list[int]]] = [{} for _ in range(n_layer)]
    output: dict[tuple[str, bool], list[int]] = {}
    embd: tuple[str, int, int] | None = None
    has_output = False
    table = [t for part, path in enumerate(paths) for t in read_header(path, part).tensors]
    for t in table:
        name = _type_name(t.ggml_type)
        m = _BLK.match(t.name)
        il = int(m.group(1)) if m else -1
        if 0 <= il < len(skipped) and skipped[il]:
            continue  # an MTP/NextN block the loader skips: never in memory, never run
        if 0 <= il < n_layer:
            key = (name, "_exps." in t.name)
            acc = layers[il].setdefault(key, [0, 0])
        elif t.name.startswith("output"):
            has_output = has_output or t.name == "output.weight"
            acc = output.setdefault((name, False), [0, 0])
        else:
            if t.name == "token_embd.weight":
                embd = (name, t.n_bytes, t.n_elements)
            continue
        acc[0] += t.n_bytes
        acc[1] += t.n_elements
    if not has_output and embd is not None:  # tied: llama.cpp duplicates token_embd as the output
        acc = output.setdefault((embd[0], False), [0, 0])
        acc[0] += embd[1]
        acc[1] += embd[2]
    return WeightSummary(
        tuple(_group(g) for g in layers),
        _group(output),
        n_expert,
        n_expert_used,
        expert_keys=expert_keys_of(table, n_layer, n_expert_used, skipped),
    )


def summary_from_profile(model: ModelProfile) -> WeightSummary:
    """An estimate from the profile alone: each layer's bytes in the file type's main type
    (:data:`FILE_TYPE_MAIN`, F16 when unknown), parameters in proportion to bytes, and for MoE
    models 90 % of a layer's bytes in experts (Mixtral 0.96, Qwen3-30B-A3B 0.9 by their tensor
    tables)."""
    t = FILE_TYPE_MAIN.get(model.file_type or "", "F16")
    mat = model.n_vocab * model.n_embd
    rest = max(0, model.n_params - mat * (1 if model.tied_output else 2))
    total = sum(model.layer_bytes) or 1
    moe = model.n_expert > 0 and model.n_expert_used > 0
    layers: list[tuple[TypedWeights, ...]] = []
    for b in model.layer_bytes:
        p = rest * b // total
        if moe:
            layers.append((TypedWeights(t, b // 10, p // 10), TypedWeights(t, b - b // 10, p - p // 10, True)))
        else:
            layers.append((TypedWeights(t, b, p),))
    out = (TypedWeights(t, model.output_bytes, mat),)
    return WeightSummary(tuple(layers), out, model.n_expert, model.n_expert_used, "profile estimate")


def weight_summary(model: ModelProfile) -> WeightSummary:
    """The model's :class:`WeightSummary` from its tensor table (cached per file and header hash;
    about as long as reading the header once), or :func:`summary_from_profile` when the file
    cannot be read or does not match the profile. The MTP/NextN blocks llama.cpp's loader skips
    (``structure.skipped_layer_bytes``, as the profile's ``layer_bytes`` leaves them out) are
    empty layers of the summary. For gpt-oss, ``routed`` is :data:`GPT_OSS_ROUTED_SHARE`."""
    s = _table_summary(model)
    if model.architecture in ROUTED_SHARE_ARCHITECTURES and s.n_expert:
        s = dataclasses.replace(s, routed=GPT_OSS_ROUTED_SHARE)
    return s


def _table_summary(model: ModelProfile) -> WeightSummary:
    try:
        s = _summary_cached(
            tuple(str(p) for p in (model.parts or (model.path,))),
            model.header_sha256,
            model.n_layer,
            model.n_expert,
            model.n_expert_used,
            tuple(model.structure.is_skipped(il) for il in range(model.n_layer)),
        )
    except (GGUFError, OSError, ValueError):
        return summary_from_profile(model)
    if [sum(w.bytes_ for w in g) for g in s.layers] != list(model.layer_bytes):
        return summary_from_profile(model)  # the file changed under the profile
    return s


def moved_weights(model: ModelProfile, moved: dict[str, str]) -> dict[int, list[tuple[str, TypedWeights]]]:
    """The weights tensor overrides moved off their layer's device, per repeating layer: ``{il:
    [(device, TypedWeights)]}`` from the tensor table (``moved``: tensor name -> device, from
    :attr:`kvtuner.core.plan.memory_plan.MemoryPlan.moves`). A caller takes them out of the
    layer's :class:`WeightSummary` group of the same type and expert flag."""
    if not moved:
        return {}
    out: dict[int, dict[tuple[str, str, bool], list[int]]] = {}
    for t in model.tensors:
        dev = moved.get(t.name)
        m = _BLK.match(t.name)
        if dev is None or not m:
            continue
        acc = out.setdefault(int(m.group(1)), {}).setdefault((dev, _type_name(t.ggml_type), "_exps." in t.name), [0, 0])
        acc[0] += t.n_bytes
        acc[1] += t.n_elements
    return {il: [(d, TypedWeights(ty, b, p, e)) for (d, ty, e), (b, p) in sorted(g.items())] for il, g in out.items()}
