"""llama.cpp's numeric rules that the planner, the speed model, the tuner and the advisor share,
each defined once here with the llama.cpp source it copies (b11434).

- **Context padding** (:data:`CTX_PAD_CELLS`, :func:`pad_ctx`): the context constructor
  (src/llama-context.cpp ``llama_context::llama_context``) pads ``n_ctx`` and, with split
  streams, ``n_ctx_seq`` up to a multiple of 256 (``GGML_PAD(cparams.n_ctx, 256)``); the
  sliding-window cache is padded the same way (src/llama-kv-cache-iswa.cpp
  ``GGML_PAD(min(size_base, n_swa * ... + n_ubatch), 256)``), the attention's ``n_kv`` is at
  least 256 and padded to it (src/llama-kv-cache.cpp ``llama_kv_cache::get_n_kv``:
  ``n_pad_cur = max(n_pad, 256u)``), and ``--fit`` rounds a reduced context down to 256 per
  stream (common/fit.cpp ``common_params_fit_impl``, "round down context for CUDA backend").
- **Op offload batch** (:data:`OFFLOAD_MIN_BATCH`): a GPU backend runs an op whose weights are in
  host memory on the GPU once it has this many rows (ggml-cuda.cu
  ``ggml_backend_cuda_device_offload_op``: ``get_op_batch_size(op) >= op_offload_min_batch_size``,
  which ``ggml_backend_cuda_reg`` reads from ``GGML_OP_OFFLOAD_MIN_BATCH``, default 32;
  the Vulkan, SYCL and Metal backends use the same variable and default).
- **Sequences** (:data:`LLAMA_MAX_SEQ`): the most parallel sequences a context takes
  (src/llama-cparams.h ``LLAMA_MAX_SEQ``).
- **Output buffer** (:func:`output_buffer_bytes`): the logits a context reserves when it is
  created (src/llama-context.cpp ``output_reserve(n_seq_max)``).
"""

from __future__ import annotations

from ..units import pad_to

#: llama.cpp's context padding in KV cells (src/llama-context.cpp ``GGML_PAD(cparams.n_ctx, 256)``).
CTX_PAD_CELLS = 256
#: Rows from which a GPU backend runs an op on host-resident data itself (ggml-cuda.cu
#: ``ggml_backend_cuda_device_offload_op``; ``GGML_OP_OFFLOAD_MIN_BATCH`` default).
OFFLOAD_MIN_BATCH = 32
#: Most sequences one context holds (src/llama-cparams.h ``LLAMA_MAX_SEQ``).
LLAMA_MAX_SEQ = 256


def pad_ctx(n_cells: int) -> int:
    """``n_cells`` (a context or cache size, cells) rounded up to a multiple of
    :data:`CTX_PAD_CELLS`, as llama.cpp pads it (``GGML_PAD(n, 256)``); 0 stays 0."""
    return pad_to(n_cells, CTX_PAD_CELLS)


def output_buffer_bytes(n_vocab: int, n_seq: int) -> int:
    """Bytes of the output buffer a new context reserves on the host: f32 logits of ``n_vocab``
    for ``max(1, n_seq)`` rows (src/llama-context.cpp: the constructor calls
    ``output_reserve(n_seq_max)``, which sizes ``max(n_outputs, n_seq_max)`` rows)."""
    return n_vocab * max(1, n_seq) * 4


def round_down_ctx(n_cells: int, n_streams: int = 1) -> int:
    """``n_cells`` rounded down to a multiple of ``CTX_PAD_CELLS x n_streams`` (common/fit.cpp:
    ``n_ctx - n_ctx % (256 * n_streams)``)."""
    align = CTX_PAD_CELLS * n_streams
    return n_cells - n_cells % align
