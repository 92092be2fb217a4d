"""Which llama.cpp build and which program a plan models ("rules").

The compute buffer llama.cpp reserves depends on the build (what its graph builders put in the
reserve graph) and on the program that creates the context (how many outputs it reserves). Each
:class:`BuildRules` names one (build, program) pair and the graph facts read from that build's
source:

- **outputs reserved**: ``llama_context::sched_reserve`` (src/llama-context.cpp) reserves the
  prompt graph for ``n_outputs = min(n_tokens, cparams.n_outputs_max)``. A generic context
  (llama-cli, llama-fit-params, llama-cpp-python) leaves ``n_outputs_max`` at 0, which means
  ``n_batch``: every token of the ubatch is an output. llama-server b11434 sets it to one output
  per slot (tools/server/server-context.cpp ``server_output_limits``:
  ``common_speculative_get_output_limits(n_batch, n_parallel, n_draft)``, total
  ``min(n_batch, n_parallel x (1 + n_draft))``; its log prints ``n_outputs_max = 1`` for ``-np 1``),
  so its logits and last-layer rows are ``n_parallel`` wide instead of ``n_ubatch``.
- **embedding inputs**: b11434's ``llm_graph_context::build_inp_embd`` (src/llama-graph.cpp)
  selects among three inputs (tokens, embeddings, and a mixed batch: a ``ggml_dup`` of an
  embeddings input with the token rows ``ggml_set_rows`` into it) for architectures
  ``llm_arch_supports_mixed_batch`` allows, and applies a token scale (Gemma's
  ``sqrt(n_embd)``) as ``ggml_mul`` by an ``inp_scale_rows [1, n_tokens]`` input; the vendored
  build (llama-cpp-python 0.3.36) selects between two and scales with ``ggml_scale``.
- **recurrent state rows**: b11434's ``build_rs`` gathers every state row in one ``get_rows``
  (``states_all``) and views the ubatch's rows in it; the vendored build gathers the ubatch's rows
  and the extra rows separately.

:func:`rules_for` picks the rules for an engine: the embedded engine plans as the vendored build;
a llama-server plans as llama-server of the newest build kvtuner knows that is not newer than it,
and any build other than one kvtuner read says "approximate for b<N>".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

#: Programs a plan can model.
PROGRAM_SERVER = "llama-server"
PROGRAM_GENERIC = "generic"  # llama-cli, llama-fit-params, llama-cpp-python: a default context


@dataclass(frozen=True)
class BuildRules:
    """The build and program a plan's compute buffer follows.

    Attributes:
        build: llama.cpp's build number the rules were read from (``11434``); None for the build
            llama-cpp-python vendors (it carries no build number).
        build_name: how the build is named in text (``"b11434"``, ``"llama-cpp-python 0.3.36"``).
        program: :data:`PROGRAM_SERVER` or :data:`PROGRAM_GENERIC`.
        outputs_per_seq: the reserve graph holds one output per sequence (llama-server), not one
            per token of the ubatch.
        mixed_embd: the embedding input holds the mixed-batch branch (b11434 ``build_inp_embd``).
        scale_rows: a token-embedding scale is a ``ggml_mul`` by an ``[1, n_tokens]`` input.
        rs_gather: recurrent states are gathered in one ``get_rows`` of all rows (b11434 ``build_rs``).
        approximate_for: the build of the engine these rules stand in for when kvtuner has not read
            that build (``-1``: the engine does not say its build); None when they are its own.
    """

    build: int | None
    build_name: str
    program: str
    outputs_per_seq: bool = False
    mixed_embd: bool = False
    scale_rows: bool = False
    rs_gather: bool = False
    approximate_for: int | None = None

    @property
    def label(self) -> str:
        """``"llama-server b11434"``, ``"generic context of b11434"``, ``"llama-cpp-python 0.3.36
        (embedded)"``."""
        if self.build is None:
            return f"{self.build_name} (embedded)"
        if self.program == PROGRAM_SERVER:
            return f"llama-server {self.build_name}"
        return f"generic context of {self.build_name} (llama-cli, llama-fit-params)"

    @property
    def approximate_line(self) -> str:
        """The one line a plan shows when the engine's build is not the one these rules were read
        from ("" when it is)."""
        if self.approximate_for is None:
            return ""
        which = "an unknown build" if self.approximate_for < 0 else f"b{self.approximate_for}"
        return (
            f"compute buffers approximate for {which}: planned with the rules of {self.label}, "
            "the newest build kvtuner has read (plan --verify asks the engine)"
        )

    def n_outputs(self, n_tokens: int, n_seq: int) -> int:
        """Outputs of the reserve graph for a ubatch of ``n_tokens`` over ``n_seq`` sequences
        (llama-context.cpp ``sched_reserve``: ``min(n_tokens, n_outputs_max)``)."""
        if self.outputs_per_seq:
            return max(1, min(n_tokens, max(1, n_seq)))
        return n_tokens

    def to_dict(self) -> dict[str, Any]:
        """The ``rules`` entry of ``kvtuner plan --json``."""
        return {
            "build": self.build,
            "build_name": self.build_name,
            "program": self.program,
            "label": self.label,
            "outputs_per_seq": self.outputs_per_seq,
            "approximate": self.approximate_line or None,
        }


#: llama-cpp-python 0.3.36's vendored llama.cpp (commit 0c1e570, ggml 0.25.3), the embedded engine.
VENDORED = BuildRules(None, "llama-cpp-python 0.3.36", PROGRAM_GENERIC)
#: llama.cpp b11434 (ggml 0.26.0) as llama-server runs it.
B11434_SERVER = BuildRules(
    11434, "b11434", PROGRAM_SERVER, outputs_per_seq=True, mixed_embd=True, scale_rows=True, rs_gather=True
)
#: llama.cpp b11434 in a generic context (llama-cli, llama-fit-params, a newer llama-cpp-python).
B11434_GENERIC = BuildRules(11434, "b11434", PROGRAM_GENERIC, mixed_embd=True, scale_rows=True, rs_gather=True)

#: Every (build, program) kvtuner has read, oldest build first.
KNOWN = (VENDORED, B11434_GENERIC, B11434_SERVER)


def rules_for(kind: str, build: int | None = None, program: str = PROGRAM_SERVER) -> BuildRules:
    """The rules a plan follows for an engine.

    Args:
        kind: ``"embedded"`` (llama-cpp-python in kvtuner's runner) or ``"server"`` (a llama.cpp
            binary the user runs).
        build: the binary's build number (None: it does not say).
        program: for a server engine, :data:`PROGRAM_SERVER` or :data:`PROGRAM_GENERIC` (llama-cli).

    Returns:
        The vendored rules for the embedded engine; for a binary, the rules of the newest build
        kvtuner has read, marked ``approximate_for`` unless ``build`` is that build.

    Raises:
        ValueError: an unknown ``kind`` or ``program``.
    """
    if kind == "embedded":
        return VENDORED
    if kind != "server":
        raise ValueError(f"unknown engine kind {kind!r}: embedded or server")
    if program not in (PROGRAM_SERVER, PROGRAM_GENERIC):
        raise ValueError(f"unknown program {program!r}: {PROGRAM_SERVER} or {PROGRAM_GENERIC}")
    candidates = [r for r in KNOWN if r.build is not None and r.program == program]
    newest = max(candidates, key=lambda r: r.build or 0)
    if build == newest.build:
        return newest
    return replace(newest, approximate_for=-1 if build is None else build)


def rules_for_target(target: str, server_build: int | None = None, server_kind: str = "embedded") -> BuildRules:
    """The rules an export target is planned with: a llama-server export as llama-server (of the
    engine's build when the engine is a llama-server, else the newest build kvtuner has read), a
    llama-cli export as a generic context of that build, a llama-cpp-python export as the vendored
    build; any other target as llama-server.

    Raises:
        ValueError: never for a known target; an unknown ``server_kind`` raises as in :func:`rules_for`.
    """
    if target.startswith("llama-cpp-python"):
        return VENDORED
    program = PROGRAM_GENERIC if target == "llama-cli" else PROGRAM_SERVER
    if server_kind == "server":
        return rules_for("server", server_build, program)
    newest = max((r for r in KNOWN if r.build is not None and r.program == program), key=lambda r: r.build or 0)
    return newest
