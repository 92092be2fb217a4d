"""GGUF fixtures of what llama-server loads beside a model: LoRA adapters (zero weights, real
shapes of the base model's tensors).

A LoRA adapter (src/llama-adapter.cpp ``llama_adapter_lora_init_impl``): ``general.type =
adapter``, ``general.architecture`` = the base model's, ``adapter.type = lora``,
``adapter.lora.alpha``; per adapted tensor ``<name>.lora_a`` with ggml shape ``[ne0, r]`` and
``<name>.lora_b`` with ``[r, ne1]`` where ``[ne0, ne1]`` is the base tensor's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from kvtuner.core.model.gguf_header import read_header

LORA_TARGETS = ("attn_q", "attn_v")


def write_lora(path: str | Path, base: str | Path, *, rank: int = 8, alpha: float = 16.0,
               targets: Sequence[str] = LORA_TARGETS) -> Path:
    """Write a zero-weight f32 LoRA adapter of rank ``rank`` for the ``targets`` of every layer of
    the GGUF model ``base``. Returns the path."""
    h = read_header(base)
    arch = h.metadata["general.architecture"]
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for t in h.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in targets and parts[3] == "weight":
            ne0, ne1 = t.shape[0], t.shape[1]
            # numpy order is ggml's reversed: lora_a ggml [ne0, r] -> numpy (r, ne0)
            w.add_tensor(t.name + ".lora_a", np.zeros((rank, ne0), dtype=np.float32))
            w.add_tensor(t.name + ".lora_b", np.zeros((ne1, rank), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_not_gguf(path: str | Path) -> Path:
    """A file that is not GGUF (a text file)."""
    path = Path(path)
    path.write_text("not a gguf file\n")
    return path
