"""Write sparse GGUF files: a real header and tensor table, the tensor data a hole of the right size.

llama.cpp maps a model's tensor data and its no_alloc dry run reads none of it, so a file whose
data section is a hole (``truncate``) costs a few KiB of disk at any model size; the parts a run
does read (a probe's MXFP4 scales, routing tensors) are written where the caller gives data.
The layout is GGUF's (ggml/src/gguf.cpp ``gguf_init_from_file_impl``): the data section starts at
the end of the tensor table rounded up to ``general.alignment`` (default 32,
``GGUF_DEFAULT_ALIGNMENT``), and each tensor's data starts at a multiple of it, in table order --
what gguf-py's ``GGUFWriter`` writes for the tensor infos it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import gguf
import numpy as np

#: a tensor's type as the callers spell it: a ``GGMLQuantizationType``, its number or its name ("MXFP4")
T = TypeVar("T", gguf.GGMLQuantizationType, int, str)


def quant_type(t: gguf.GGMLQuantizationType | int | str) -> gguf.GGMLQuantizationType:
    """``t`` as gguf's ``GGMLQuantizationType`` (a name such as ``"Q4_K"`` or a ggml type number).

    Raises:
        KeyError / ValueError: no such type."""
    return gguf.GGMLQuantizationType[t] if isinstance(t, str) else gguf.GGMLQuantizationType(t)


def tensor_nbytes(shape: Sequence[int], t: gguf.GGMLQuantizationType | int | str) -> int:
    """Bytes of a tensor of ``shape`` elements (any order) of type ``t``: whole blocks of
    ``GGML_QUANT_SIZES[t]`` (elements per block, bytes per block; ggml.c ``ggml_row_size``)."""
    block, size = gguf.GGML_QUANT_SIZES[quant_type(t)]
    return int(np.prod(shape)) // block * size


def add_transformer_keys(
    writer: gguf.GGUFWriter,
    n_layer: int,
    n_ctx_train: int,
    n_embd: int,
    n_ff: int | Sequence[int],
    n_head: int | Sequence[int],
    n_head_kv: int | Sequence[int],
) -> None:
    """The six hyper-parameters every transformer's ``llama_model::load_hparams`` reads
    (src/llama-model.cpp: ``{arch}.block_count``, ``context_length``, ``embedding_length``,
    ``feed_forward_length``, ``attention.head_count``, ``attention.head_count_kv``); a per-layer
    sequence is written as an array, as llama.cpp's ``get_key_or_arr`` accepts."""
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff if isinstance(n_ff, int) else list(n_ff))
    writer.add_head_count(n_head if isinstance(n_head, int) else list(n_head))
    writer.add_head_count_kv(n_head_kv if isinstance(n_head_kv, int) else list(n_head_kv))


def _aligned(n_bytes: int) -> int:
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    return -(-n_bytes // align) * align


def write_sparse_gguf(
    path: str | Path,
    writer: gguf.GGUFWriter,
    tensors: Sequence[tuple[str, tuple[int, ...], T]],
    data: Callable[[str, tuple[int, ...], T], Iterable[bytes] | None] | None = None,
) -> dict[str, int]:
    """Finish the GGUF that ``writer`` (opened on ``path``, metadata added) writes: the tensor
    table of ``tensors`` (name, shape in ggml order ``ne0`` first, type), then the file extended
    to cover every tensor's data as a hole; where ``data(name, shape, type)`` gives chunks of
    bytes, they are written at that tensor's offset. Closes ``writer``.

    Returns:
        Each tensor's data offset from the start of the file, in bytes.
    Raises:
        OSError: the file cannot be written."""
    path = Path(path)
    for name, shape, t in tensors:
        writer.add_tensor_info(
            name, shape[::-1], np.dtype(np.float32), tensor_nbytes(shape, t), raw_dtype=quant_type(t)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    offsets: dict[str, int] = {}
    offset = _aligned(path.stat().st_size)
    for name, shape, t in tensors:
        offsets[name] = offset
        offset += _aligned(tensor_nbytes(shape, t))
    with open(path, "r+b") as f:
        f.truncate(offset)
        if data is not None:
            for name, shape, t in tensors:
                chunks = data(name, shape, t)
                if chunks is not None:
                    f.seek(offsets[name])
                    for chunk in chunks:
                        f.write(chunk)
    return offsets
