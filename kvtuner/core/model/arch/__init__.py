"""The architecture registry: one :class:`~.family.Family` per GGUF ``general.architecture``,
registered in one table, :data:`REGISTRY`.

Each module of this package holds one family or family group and its sources:
:mod:`.llama`, :mod:`.gemma`, :mod:`.qwen`, :mod:`.deepseek` (MLA), :mod:`.glm`, :mod:`.gpt_oss`,
:mod:`.hybrid` (recurrent and hybrid memories) and :mod:`.others`. The structure rules
(:func:`kvtuner.core.model.hparams.derive_structure`), the reserve graph
(:func:`kvtuner.core.plan.reserve_graph.transformer_shape`), the compute-buffer phase estimate
(:mod:`kvtuner.core.plan.compute_buffer`) and the speed model ask :func:`family_of`; none of them
names an architecture. An architecture not in the table is planned with :func:`generic` (every
layer full attention, figures labelled approximate).

The table lives in the model layer because the structure is derived when a GGUF is read
(:mod:`kvtuner.core.model.profile`), below the planner and the speed model that read it too.
"""

from __future__ import annotations

from . import deepseek, gemma, glm, gpt_oss, hybrid, llama, others, qwen
from .family import Family, GraphFacts, GraphRules, LayerRules

__all__ = ["REGISTRY", "Family", "GraphFacts", "GraphRules", "LayerRules", "family_of", "generic", "register"]

#: the modules that define families, in the order they register
MODULES = (llama, gemma, qwen, deepseek, glm, gpt_oss, hybrid, others)

#: every known architecture, keyed by GGUF ``general.architecture``
REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to :data:`REGISTRY` (replacing one of the same ``arch``) and return it."""
    REGISTRY[family.arch] = family
    return family


def generic(arch: str) -> Family:
    """The family of an architecture kvtuner has no rules for: every layer full attention."""
    return Family(arch, arch)


def family_of(arch: str) -> Family:
    """The registered family of ``arch``, else :func:`generic`."""
    fam = REGISTRY.get(arch)
    return fam if fam is not None else generic(arch)


for _module in MODULES:
    for _family in _module.FAMILIES:
        if _family.arch in REGISTRY:
            raise ValueError(f"architecture {_family.arch} registered twice ({_module.__name__})")
        register(_family)


def families_markdown() -> str:
    """The registry as a Markdown table, one row per architecture in registration order: the
    module that defines it, its memory, whether its structure rules are checked against llama.cpp
    (``tested``), whether its compute buffer's reserve graph is rebuilt node by node, and whether
    its memory is one kvtuner does not model. docs/development/adding-an-architecture.md holds it
    (tests/test_arch_registry.py keeps the two equal)."""
    rows = [
        "| `general.architecture` | family | module | memory | structure checked | graph rebuilt | special memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for module in MODULES:
        for fam in module.FAMILIES:
            short = module.__name__.rsplit(".", 1)[1]
            flags = ("yes" if fam.tested else "", "yes" if fam.graph else "", "yes" if fam.special_memory else "")
            rows.append(f"| `{fam.arch}` | {fam.title} | `{short}.py` | {fam.memory} | " + " | ".join(flags) + " |")
    return "\n".join(rows) + "\n"
