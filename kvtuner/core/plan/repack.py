"""The ``CPU_REPACK`` copy: quantized weights ggml-cpu re-lays out for its matmul kernels.

On CPUs with the right instructions, llama.cpp puts the host layers' matrix weights of some
quantized types into the CPU's "extra" buffer type (ggml/src/ggml-cpu/repack.cpp,
``ggml_backend_cpu_repack_buffer_type``, named ``CPU_REPACK``) and copies them there in an
interleaved layout while loading (``ggml_backend_cpu_repack_buffer_set_tensor``). That copy
is committed (anonymous) memory the size of the tensors (``get_alloc_size`` defaults to
``ggml_nbytes``), on top of the memory-mapped file pages the loader read it from.

Which tensors: ``ggml_repack_get_optimal_repack_type`` (repack.cpp) picks a layout by type,
the CPU's instruction sets and the rows ``ne[1]``; the buffer type ``supports_op`` only for
2-D ``MUL_MAT`` and 3-D ``MUL_MAT_ID`` (expert) weights, so never the token embedding
(``GET_ROWS``), norms or biases. llama.cpp offers the extra buffer types after a GPU's host
buffer type (src/llama-model.cpp ``make_cpu_buft_list``), so with a GPU device the host
layers' weights go to pinned host memory and are not repacked: :func:`repack_bytes` plans
the copy for CPU-only runs. RISC-V vector kernels are not modelled.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import gguf

if TYPE_CHECKING:  # pragma: no cover
    from ..model.profile import ModelProfile

GQT = gguf.GGMLQuantizationType
_BLK = re.compile(r"^blk\.(\d+)\.")
#: tensors read with GET_ROWS (llama-arch.cpp LLM_TENSOR_INFOS): never repacked
_GET_ROWS = ("token_embd.", "per_layer_token_embd.", "token_types.", "position_embd.")

#: CPU features this module reads (names as :func:`kvtuner.core.hardware.host.cpu_features`
#: reports them): ggml_cpu_has_avx2, _avx512, _neon, _dotprod, _matmul_int8 ("i8mm").
FEATURES = ("avx2", "avx512", "neon", "dotprod", "i8mm")


def repack_rows(ggml_type: int, features: frozenset[str]) -> int:
    """The row multiple ``ne[1]`` a tensor of ``ggml_type`` needs to be repacked on a CPU with
    ``features``, 0 if it is never repacked there (repack.cpp ``ggml_repack_get_optimal_repack_type``)."""
    x86, avx512 = "avx2" in features, "avx512" in features
    arm_mm = "neon" in features and "i8mm" in features
    arm_dot = "neon" in features and "dotprod" in features
    t = ggml_type
    if t == GQT.Q4_0:
        return 8 if x86 else (4 if (arm_mm or arm_dot) else 0)
    if t == GQT.Q4_K:
        return 8 if (x86 or arm_mm or arm_dot) else 0
    if t == GQT.Q2_K:
        return 8 if avx512 else 0
    if t in (GQT.Q5_K, GQT.Q6_K):
        return 8 if (arm_mm or arm_dot) else 0
    if t == GQT.IQ4_NL:
        return 8 if x86 else (4 if arm_dot else 0)
    if t == GQT.MXFP4:
        return 8 if x86 else (4 if arm_dot else 0)
    if t == GQT.Q8_0:
        return 4 if (arm_mm or arm_dot) else 0
    return 0


def _repackable(name: str, shape: tuple[int, ...], ggml_type: int, features: frozenset[str]) -> bool:
    if name.startswith(_GET_ROWS) or len(shape) not in (2, 3):
        return False
    if len(shape) == 3 and "_exps." not in name:  # 3-D: only expert weights are MUL_MAT_ID
        return False
    rows = repack_rows(ggml_type, features)
    return bool(rows) and shape[1] > 1 and shape[1] % rows == 0


_CACHE: dict[tuple, tuple[tuple[int, ...], int, int]] = {}


def _per_layer(
    key: tuple, tensors: tuple, n_layer: int, skipped: tuple[bool, ...], features: frozenset[str]
) -> tuple[tuple[int, ...], int, int]:
    """Repacked bytes per layer, of the other host tensors, and of the output (cached per model
    and feature set: a slider move does not walk the tensor table)."""
    ck = (key, features)
    hit = _CACHE.get(ck)
    if hit is not None:
        return hit
    layers = [0] * n_layer
    other = output = 0
    for t in tensors:
        if not _repackable(t.name, t.shape, t.ggml_type, features):
            continue
        m = _BLK.match(t.name)
        if m:
            il = int(m.group(1))
            if il < n_layer:
                if not skipped[il]:
                    layers[il] += t.n_bytes
                continue
        if t.name.startswith("output"):
            output += t.n_bytes
        else:
            other += t.n_bytes
    result = (tuple(layers), other, output)
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[ck] = result
    return result


def repack_bytes(
    model: ModelProfile,
    host_layers: Iterable[int],
    output_on_host: bool,
    features: frozenset[str] | None,
    *,
    gpu_present: bool,
) -> int:
    """Bytes of the ``CPU_REPACK`` buffer llama.cpp allocates for this placement.

    Args:
        model: the model (its tensor table).
        host_layers: repeating layers whose weights stay on the host.
        output_on_host: whether ``output.weight`` stays on the host.
        features: the CPU's instruction sets (None: unknown, planned as none).
        gpu_present: a GPU device is in use (its host buffer type comes first: no repack).

    Returns:
        Bytes (0 when nothing is repacked).
    """
    if gpu_present or not features or not model.tensors:
        return 0
    skipped = tuple(model.structure.is_skipped(il) for il in range(model.n_layer))
    per_layer, other, output = _per_layer(
        (model.header_sha256, str(model.path), model.n_layer),
        model.tensors,
        model.n_layer,
        skipped,
        frozenset(features),
    )
    total = sum(per_layer[il] for il in host_layers) + other
    if output_on_host:
        total += output
    return total
