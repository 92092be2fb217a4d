"""Typed access to a GGUF header's metadata, and the generic hyper-parameters llama.cpp reads.

:class:`Meta` reads keys the way llama.cpp's ``llama_model_loader::get_key`` / ``get_key_or_arr`` /
``get_arr`` do (src/llama-model-loader.cpp), with one-line errors naming the file and key;
:class:`Hparams` holds what the generic part of ``llama_model_base::load_hparams``
(src/llama-model.cpp) reads (:func:`kvtuner.core.model.hparams.read_hparams`).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf_header import ArrayInfo, GGUFError


class Meta:
    """Typed access to GGUF metadata with errors that name the file and key (one line)."""

    def __init__(self, path: Path, md: dict[str, Any], arch: str) -> None:
        self.path, self.md, self.arch = path, md, arch

    def key(self, template: str) -> str:
        """``template`` with ``{arch}`` filled in."""
        return template.format(arch=self.arch)

    def has(self, template: str) -> bool:
        """Whether the key is present."""
        return self.key(template) in self.md

    def int(self, template: str, default: int | None = None, *, required: bool = False) -> int:
        """A non-negative integer key (llama.cpp ``get_key`` on a uint32).

        Raises:
            GGUFError: missing (when required), not an integer, or negative.
        """
        k = self.key(template)
        if k not in self.md:
            if required:
                raise GGUFError(f"{self.path}: missing metadata key {k}")
            return default  # type: ignore[return-value]
        v = self.md[k]
        if isinstance(v, bool) or not isinstance(v, int):
            raise GGUFError(f"{self.path}: metadata {k} should be an integer, found {type(v).__name__}")
        if v < 0:
            raise GGUFError(f"{self.path}: metadata {k} is negative ({v})")
        return v

    # annotations below name the builtin explicitly: in this class body `int` is the method above
    def per_layer(
        self, template: str, n_layer: builtins.int, default: builtins.int | tuple[builtins.int, ...] | None
    ) -> tuple[builtins.int, ...] | None:
        """Scalar-or-array key (llama.cpp ``get_key_or_arr``): ``n_layer`` values.

        Raises:
            GGUFError: an array of the wrong length or element type.
        """
        k = self.key(template)
        if k not in self.md:
            if default is None or isinstance(default, tuple):
                return default
            return (default,) * n_layer
        v = self.md[k]
        if isinstance(v, tuple):
            if len(v) != n_layer or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
                raise GGUFError(f"{self.path}: metadata {k} should hold {n_layer} non-negative integers, one per layer")
            return tuple(int(x) for x in v)
        if isinstance(v, ArrayInfo):
            raise GGUFError(f"{self.path}: metadata {k} has {v.count} entries, expected {n_layer}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise GGUFError(f"{self.path}: metadata {k} should be an integer or an array of integers")
        return (int(v),) * n_layer

    def bool_array(self, template: str, n_max: builtins.int) -> tuple[bool, ...] | None:
        """A bool/int array key of at most ``n_max`` entries (llama.cpp ``get_arr`` into a
        per-layer array), None if absent or not an array.

        Raises:
            GGUFError: longer than ``n_max`` (llama.cpp refuses it too).
        """
        k = self.key(template)
        v = self.md.get(k)
        if isinstance(v, ArrayInfo):
            raise GGUFError(f"{self.path}: metadata {k} has {v.count} entries, more than the {n_max} layers")
        if not isinstance(v, tuple):
            return None
        if len(v) > n_max:
            raise GGUFError(f"{self.path}: metadata {k} has {len(v)} entries, more than the {n_max} layers")
        return tuple(bool(x) for x in v)

    def str(self, key: str) -> str | None:
        """A string key (full key name), None if absent.

        Raises:
            GGUFError: present but not a string.
        """
        v = self.md.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise GGUFError(f"{self.path}: metadata {key} should be a string, found {type(v).__name__}")
        return v


@dataclass(frozen=True)
class Hparams:
    """The generic part of llama.cpp's ``load_hparams`` (src/llama-model.cpp).

    Per-layer tuples have ``n_layer_all`` entries.
    """

    arch: str
    n_layer_all: int
    n_nextn: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    head_k_full: int
    head_v_full: int
    head_k_swa: int
    head_v_swa: int

    @property
    def n_layer(self) -> int:
        """Trunk layers: ``n_layer_all - n_layer_nextn`` (llama-hparams.cpp ``n_layer``)."""
        return self.n_layer_all - self.n_nextn
