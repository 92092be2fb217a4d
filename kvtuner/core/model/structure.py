"""Per-layer memory structure of a model: which layers hold KV, recurrent state, or nothing.

A :class:`ModelStructure` is what llama.cpp's memory constructors see for one model: for every
block of ``block_count`` (``n_layer_all``) whether it gets its own K/V entry in the main
context's attention cache (``llama_kv_cache`` constructor: ``has_kv``, the layer filter, the
reuse/share callbacks), whether it is a sliding-window/chunked layer (``hparams.is_swa``),
whether it gets a recurrent/conv state row (``llama_memory_recurrent`` constructor, its layer
filter), whether it is an MTP/NextN block (``il >= hparams.n_layer()``), and its K/V row widths
(``n_embd_k_gqa(il)`` / ``n_embd_v_gqa(il)``). Sources: src/llama-model.cpp ``create_memory``,
src/llama-hparams.cpp, src/llama-kv-cache.cpp, src/llama-kv-cache-iswa.cpp,
src/llama-memory-hybrid.cpp, src/llama-memory-recurrent.cpp of the llama.cpp that
llama-cpp-python 0.3.36 vendors.

It comes from one of three places, named by ``source``:

- ``"analytic"``: kvtuner's own rules for the architecture (:mod:`kvtuner.core.model.hparams`),
  each checked against llama.cpp's dry run in the tests (tests/test_model_families.py);
- ``"probe"``: read from a no_alloc load of the installed llama.cpp (the runner's structure
  probe parses its per-layer log lines), remembered per model header and llama.cpp build;
- ``"approximate"``: neither is available; ``note`` says why, and the plan shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: ``memory`` values: which llama.cpp memory ``create_memory`` builds.
MEMORY_KINDS = ("kv", "iswa", "hybrid", "hybrid-iswa", "recurrent", "none")
#: ``swa_type`` values (llama-hparams.h ``llama_swa_type``).
SWA_TYPES = ("none", "standard", "chunked", "symmetric")


@dataclass(frozen=True)
class LayerRole:
    """What llama.cpp keeps for layer ``il`` of the main context.

    Attributes:
        il: layer index, 0 .. n_layer_all - 1.
        kv: the layer has its own K (and V) tensors in the attention cache.
        swa: the layer is a sliding-window or chunked-attention layer (``hparams.is_swa(il)``);
            its KV lives in the SWA cache of an iSWA memory.
        reuse: index of the layer whose KV it reads (Gemma 3n / Gemma 4 shared KV), or -1.
        recurrent: the layer has a recurrent/conv state row (``cache_r_l`` / ``cache_s_l``).
        nextn: an MTP/NextN block (``il >= n_layer``): not part of the main context's memory.
        k_width, v_width: ``n_embd_k_gqa(il)`` and ``n_embd_v_gqa(il)`` (elements per cell).
        head_k, head_v: ``n_embd_head_k(il)`` and ``n_embd_head_v(il)`` (the head sizes the
            quantized-cache block check of ``llama_init_from_model`` reads).
    """

    il: int
    kv: bool
    swa: bool = False
    reuse: int = -1
    recurrent: bool = False
    nextn: bool = False
    k_width: int = 0
    v_width: int = 0
    head_k: int = 0
    head_v: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "il": self.il,
            "kv": self.kv,
            "swa": self.swa,
            "reuse": self.reuse,
            "recurrent": self.recurrent,
            "nextn": self.nextn,
            "k_width": self.k_width,
            "v_width": self.v_width,
            "head_k": self.head_k,
            "head_v": self.head_v,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerRole:
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        return cls(
            **{
                k: d[k]
                for k in ("il", "kv", "swa", "reuse", "recurrent", "nextn", "k_width", "v_width", "head_k", "head_v")
                if k in d
            }
        )


@dataclass(frozen=True)
class ModelStructure:
    """The memory structure of a model (see the module docstring).

    Attributes:
        layers: one :class:`LayerRole` per block (``n_layer_all`` entries).
        n_layer: trunk layers (``hparams.n_layer() = n_layer_all - n_layer_nextn``).
        memory: the llama.cpp memory type (:data:`MEMORY_KINDS`).
        n_swa: sliding window / attention chunk in tokens (0: none).
        swa_type: :data:`SWA_TYPES`.
        state_r, state_s: f32 values per recurrent layer per state row (``n_embd_r()`` and
            ``n_embd_s()``, llama-hparams.cpp).
        is_mla: K-only latent cache (llama-hparams.cpp ``is_mla``).
        v_width_max: ``n_embd_v_gqa_max()`` over all blocks: the V row width of every layer when
            V is transposed (flash attention off; llama-kv-cache.cpp [TAG_V_CACHE_VARIABLE]).
        source: ``analytic``, ``probe`` or ``approximate``.
        note: why it is approximate ("" otherwise).
        llama_build: the llama.cpp build a probe came from ("" for analytic structures).
        skipped_layer_bytes: weights llama.cpp does not load (MTP/NextN tensors with
            ``load_mtp`` off: llama-model-loader.cpp ``TENSOR_SKIP``), bytes.
    """

    layers: tuple[LayerRole, ...]
    n_layer: int
    memory: str = "kv"
    n_swa: int = 0
    swa_type: str = "none"
    state_r: int = 0
    state_s: int = 0
    is_mla: bool = False
    v_width_max: int = 0
    source: str = "analytic"
    note: str = ""
    llama_build: str = ""
    skipped_layer_bytes: tuple[int, ...] = field(default=())

    @property
    def n_layer_all(self) -> int:
        """Blocks in the file (``block_count``)."""
        return len(self.layers)

    def is_skipped(self, il: int) -> bool:
        """Whether block ``il``'s weights are never loaded (:attr:`skipped_layer_bytes` above 0):
        such a block is in no buffer and no graph."""
        return 0 <= il < len(self.skipped_layer_bytes) and self.skipped_layer_bytes[il] > 0

    @property
    def kv_layers(self) -> tuple[LayerRole, ...]:
        """Layers with their own KV in the main context, in order."""
        return tuple(r for r in self.layers if r.kv)

    @property
    def recurrent_layers(self) -> tuple[LayerRole, ...]:
        """Layers with a recurrent state row, in order."""
        return tuple(r for r in self.layers if r.recurrent)

    @property
    def is_iswa(self) -> bool:
        """An iSWA memory: a full cache and a window-sized one (``llama_kv_cache_iswa``)."""
        return self.memory in ("iswa", "hybrid-iswa")

    @property
    def swa_label(self) -> str:
        """Kind label of the window-sized cache: ``chunked`` for chunked attention, else ``swa``."""
        return "chunked" if self.swa_type == "chunked" else "swa"

    @property
    def is_approximate(self) -> bool:
        """True when neither a tested rule nor a probe backs this structure."""
        return self.source == "approximate"

    def with_source(self, source: str, note: str = "", llama_build: str = "") -> ModelStructure:
        """A copy with another source label."""
        return replace(self, source=source, note=note, llama_build=llama_build or self.llama_build)

    def summary(self) -> str:
        """One line: ``16 attention + 48 recurrent of 64 layers (+1 MTP)``."""
        n_kv = len(self.kv_layers)
        n_swa = sum(1 for r in self.kv_layers if r.swa)
        n_rec = len(self.recurrent_layers)
        n_reuse = sum(1 for r in self.layers if r.reuse >= 0)
        n_nextn = sum(1 for r in self.layers if r.nextn)
        parts = []
        if n_kv:
            parts.append(f"{n_kv - n_swa} full-attention" + (f" + {n_swa} {self.swa_label}" if n_swa else ""))
        if n_rec:
            parts.append(f"{n_rec} recurrent")
        if n_reuse:
            parts.append(f"{n_reuse} sharing KV")
        text = " + ".join(parts) or "no cached"
        text += f" of {self.n_layer} layers"
        if n_nextn:
            text += f" (+{n_nextn} MTP/NextN block{'s' if n_nextn > 1 else ''}, not cached)"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (the structure cache's record)."""
        return {
            "layers": [r.to_dict() for r in self.layers],
            "n_layer": self.n_layer,
            "memory": self.memory,
            "n_swa": self.n_swa,
            "swa_type": self.swa_type,
            "state_r": self.state_r,
            "state_s": self.state_s,
            "is_mla": self.is_mla,
            "v_width_max": self.v_width_max,
            "source": self.source,
            "note": self.note,
            "llama_build": self.llama_build,
            "skipped_layer_bytes": list(self.skipped_layer_bytes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelStructure:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a malformed record.
        """
        try:
            layers = tuple(LayerRole.from_dict(x) for x in d["layers"])
            s = cls(
                layers=layers,
                n_layer=int(d["n_layer"]),
                memory=str(d.get("memory", "kv")),
                n_swa=int(d.get("n_swa", 0)),
                swa_type=str(d.get("swa_type", "none")),
                state_r=int(d.get("state_r", 0)),
                state_s=int(d.get("state_s", 0)),
                is_mla=bool(d.get("is_mla", False)),
                v_width_max=int(d.get("v_width_max", 0)),
                source=str(d.get("source", "probe")),
                note=str(d.get("note", "")),
                llama_build=str(d.get("llama_build", "")),
                skipped_layer_bytes=tuple(int(x) for x in d.get("skipped_layer_bytes", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed structure record: {exc}") from None
        if s.memory not in MEMORY_KINDS or s.swa_type not in SWA_TYPES:
            raise ValueError(f"malformed structure record: memory {s.memory!r}, swa_type {s.swa_type!r}")
        return s


def differences(a: ModelStructure, b: ModelStructure) -> list[str]:
    """What differs between two structures of the same model (empty: the same memory).

    Compares, per layer, KV ownership, SWA membership (of KV layers), reuse, recurrence, the
    K/V widths of KV layers, and the window and state widths.
    """
    out: list[str] = []
    if a.n_layer_all != b.n_layer_all:
        return [f"{a.n_layer_all} vs {b.n_layer_all} blocks"]
    for x, y in zip(a.layers, b.layers):
        if (x.kv, x.reuse, x.recurrent) != (y.kv, y.reuse, y.recurrent):
            out.append(
                f"layer {x.il}: kv/reuse/recurrent {x.kv}/{x.reuse}/{x.recurrent} vs {y.kv}/{y.reuse}/{y.recurrent}"
            )
        elif x.kv and (x.swa != y.swa or x.k_width != y.k_width or x.v_width != y.v_width):
            out.append(f"layer {x.il}: swa/k/v {x.swa}/{x.k_width}/{x.v_width} vs {y.swa}/{y.k_width}/{y.v_width}")
    if a.is_iswa != b.is_iswa or (a.is_iswa and a.n_swa != b.n_swa):
        out.append(f"window {a.memory} {a.n_swa} vs {b.memory} {b.n_swa}")
    if a.recurrent_layers and (a.state_r, a.state_s) != (b.state_r, b.state_s):
        out.append(f"state rows {a.state_r}+{a.state_s} vs {b.state_r}+{b.state_s}")
    return out
