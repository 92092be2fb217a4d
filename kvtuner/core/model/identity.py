"""The identity of a model file, without hashing its weights.

A kvtuner profile and the working-configs library use it to tell "the same model" from
"another copy": a renamed file is the same model, a re-quantised one is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..jsonfields import require_object
from ..jsonfields import typed_field as _typed


@dataclass(frozen=True)
class ModelIdentity:
    """A GGUF model file, identified without hashing its weights.

    Attributes:
        file_name: name of the (first) file, e.g. ``gemma-3-270m-q4_k_m.gguf``.
        file_bytes: size in bytes of all split parts together.
        header_sha256: sha256 of the first part's bytes before the tensor data (metadata and
            tensor table, ``ModelProfile.header_sha256``); changes with any re-quantisation.
        architecture: ``general.architecture``.
        n_layer: repeating layers.
        name: ``general.name`` or None.
    """

    file_name: str
    file_bytes: int
    header_sha256: str
    architecture: str = ""
    n_layer: int = 0
    name: str | None = None

    @classmethod
    def from_profile(cls, profile: Any) -> ModelIdentity:
        """From a :class:`kvtuner.core.model.profile.ModelProfile`."""
        return cls(
            file_name=profile.file_name,
            file_bytes=int(profile.file_bytes),
            header_sha256=profile.header_sha256,
            architecture=profile.architecture,
            n_layer=int(profile.n_layer),
            name=profile.name,
        )

    @classmethod
    def from_path(cls, path: str | Path) -> ModelIdentity:
        """Read the file's header (never its weights).

        Raises:
            kvtuner.core.model.gguf_header.GGUFError: unreadable or not a GGUF language model (one line).
        """
        from ..model.profile import ModelProfile

        return cls.from_profile(ModelProfile.from_gguf(path))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelIdentity:
        """Inverse of :meth:`to_dict`; a missing key or a value of the wrong type raises
        ``ValueError`` naming it."""
        data = require_object(data, "model")
        try:
            out = cls(
                file_name=_typed(data, "file_name", str),
                file_bytes=_typed(data, "file_bytes", int),
                header_sha256=_typed(data, "header_sha256", str),
                architecture=_typed(data, "architecture", str, ""),
                n_layer=_typed(data, "n_layer", int, 0),
                name=_typed(data, "name", str, None),
            )
        except KeyError as exc:
            raise ValueError(f"model.{exc.args[0]} is missing") from None
        if out.file_bytes < 0:
            raise ValueError("model.file_bytes must not be negative")
        return out

    def same_file_as(self, other: ModelIdentity) -> bool:
        """True when size and header hash agree (the file name may differ: a renamed copy)."""
        return self.file_bytes == other.file_bytes and self.header_sha256 == other.header_sha256
