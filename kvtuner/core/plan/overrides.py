"""Tensor buffer-type overrides (``-ot``, ``--cpu-moe``, ``--n-cpu-moe``) applied tensor by tensor.

llama.cpp decides each weight's buffer in llama-model-loader.cpp ``create_tensor``: the first
override whose pattern ``std::regex_search`` finds in the tensor's name wins; otherwise the
tensor goes where its layer goes (``-ngl``). So the bytes an override moves are exactly the
``ggml_nbytes`` of the matching tensors in the GGUF tensor table (:attr:`ModelProfile.tensors`),
which is what :func:`apply_overrides` sums. The override list itself (its order, the MoE
patterns) is :func:`kvtuner.core.plan.placement.tensor_overrides`: the one placement rule.

On a CPU-only build every weight is in host memory already, so overrides to ``CPU`` change
nothing and llama.cpp refuses ``CUDA0`` as an unknown buffer type (common/arg.cpp
``parse_tensor_buffer_overrides``): the planner then applies none and says so.

With a GPU, an override to ``CPU`` uses the CPU's buffer list (llama-model-loader.cpp: "when
overriding to a CPU buffer, consider the extra buffer types"), whose first entry is the GPU's
pinned host buffer; with mmap llama.cpp swaps that for the plain CPU buffer ("avoid using a host
buffer when using mmap"), so moved weights stay memory-mapped and are not repacked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import ConfigError
from .placement import override_lookup

if TYPE_CHECKING:  # pragma: no cover
    from ..model.profile import ModelProfile

_BLK = re.compile(r"^blk\.(\d+)\.")
#: MoE expert tensors (llama-arch.cpp ``LLM_TENSOR_FFN_*_EXPS`` / ``*_CHEXPS``: ``ffn_up_exps``,
#: ``ffn_gate_up_exps``, ``ffn_down_chexps`` ...), weights and biases.
EXPERT_RE = re.compile(r"\.ffn_[a-z_]*?_(ch|)exps\.")


def is_expert(name: str) -> bool:
    """Whether tensor ``name`` is a MoE expert tensor (``blk.3.ffn_up_exps.weight``)."""
    return EXPERT_RE.search(name) is not None


@dataclass(frozen=True)
class TensorMoves:
    """Where the overrides put the weights, in bytes.

    Attributes:
        moved: ``(tensor name, from device, to device, bytes)`` for every tensor an override
            sends away from its layer's device, file order.
        expert_bytes: expert tensor bytes per device after the moves (MoE models; part of the
            device's weights).
        expert_layers: per device, the layers with expert tensors there, ascending.
    """

    moved: tuple[tuple[str, str, str, int], ...] = ()
    expert_bytes: dict[str, int] = field(default_factory=dict)
    expert_layers: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def delta(self, device: str) -> int:
        """Bytes the moves add to (positive) or take from (negative) ``device``."""
        return sum(b for _, _, to, b in self.moved if to == device) - sum(
            b for _, fr, _, b in self.moved if fr == device
        )

    def device_of(self) -> dict[str, str]:
        """Tensor name -> device, for the moved tensors only."""
        return {name: to for name, _, to, _ in self.moved}

    def largest_moved(self, to: str, experts_only: bool = True) -> int:
        """The largest single tensor moved to ``to`` (expert tensors only by default), bytes."""
        return max((b for n, _, t, b in self.moved if t == to and (is_expert(n) or not experts_only)), default=0)


def apply_overrides(
    model: ModelProfile,
    layer_devices: Sequence[str],
    overrides: tuple[tuple[str, str], ...],
    gpu_devices: Mapping[str, str],
    host: str,
) -> TensorMoves:
    """Apply ``overrides`` (``(regex, buffer)``, first match wins) to every tensor of the model.

    Args:
        model: the profile (its tensor table).
        layer_devices: device of layers ``0..n_layer`` (the last entry: the output layer).
        overrides: from :func:`kvtuner.core.plan.placement.tensor_overrides`.
        gpu_devices: each name an override may give a planned GPU (its slot ``CUDA0``, its backend's
            ``ROCm0``) -> the planner's device name; empty: CPU-only (no moves).
        host: the host device name (buffer ``CPU``).

    Returns:
        :class:`TensorMoves`; the input embedding (``token_embd``) and other input tensors start on
        the host, ``output*`` tensors on the output layer's device, ``blk.N`` on layer N's.

    Raises:
        ConfigError: an override names a GPU that is not planned (``CUDA1`` with one GPU, ``ROCm0``
            with a CUDA card).
    """
    n_layer = model.n_layer
    moved: list[tuple[str, str, str, int]] = []
    expert: dict[str, int] = {}
    layers: dict[str, set[int]] = {}
    lookup = override_lookup(overrides) if gpu_devices and overrides else None
    for t in model.tensors:
        m = _BLK.match(t.name)
        il = int(m.group(1)) if m else None
        if il is not None and il >= n_layer:
            continue  # MTP / NextN blocks beyond n_layer: the profile counts them as input
        if il is not None and model.structure.is_skipped(il):
            continue  # an MTP/NextN block the loader skips: in no buffer, so nothing to move
        default = (
            layer_devices[il] if il is not None else (layer_devices[n_layer] if t.name.startswith("output") else host)
        )
        dev = default
        if lookup is not None:
            buf = lookup(t.name)
            if buf:
                dev = host if buf == "CPU" else gpu_devices.get(buf, "")
                if not dev:
                    raise ConfigError(
                        f"--override-tensor sends {t.name} to {buf}, and no such GPU is planned "
                        f"(planned: {', '.join(sorted(gpu_devices))}): use one of them or CPU"
                    )
        if dev != default:
            moved.append((t.name, default, dev, t.n_bytes))
        if il is not None and is_expert(t.name):
            expert[dev] = expert.get(dev, 0) + t.n_bytes
            layers.setdefault(dev, set()).add(il)
    return TensorMoves(tuple(moved), expert, {d: tuple(sorted(s)) for d, s in layers.items()})
