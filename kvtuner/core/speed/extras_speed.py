"""Speed of what llama-server runs besides the model: speculative decoding with a draft model
and one image's encode time through the projector.

Speculative decoding (common/speculative.cpp, the server's draft loop): each step the draft
proposes ``n_draft`` tokens one by one (``--spec-draft-n-max``, default 3: common/common.h
``common_params_speculative_draft::n_max``), then the main model checks them in one batch of
``n_draft + 1`` tokens. With a per-token acceptance rate ``alpha``, a step yields
``(1 - alpha^(n_draft + 1)) / (1 - alpha)`` tokens on average (Leviathan et al. 2023, "Fast
Inference from Transformers via Speculative Decoding", eq. 1). A step costs ``n_draft`` draft
decode steps plus one main-model batch of ``n_draft + 1`` tokens, taken as the slower of one
main decode step (reading the weights once) and ``n_draft + 1`` tokens at the main model's
prefill rate. The acceptance rate depends on the prompt and the pair of models, so the speed
is a range over :data:`DEFAULT_ACCEPTANCE` (a setting; llama-server reports the measured rate
as ``draft acceptance rate`` in its log at the end of each request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Acceptance rates the range spans: 0.5-0.8, the span Leviathan et al. 2023 (Table 3) measure
#: for same-family draft/target pairs on text tasks.
DEFAULT_ACCEPTANCE = (0.5, 0.8)
#: ``--spec-draft-n-max``'s default in llama.cpp b11434 (common/common.h).
DEFAULT_DRAFT_N_MAX = 3


@dataclass(frozen=True)
class SpeculativeSpeed:
    """Decode tokens/s with speculative decoding over a range of acceptance rates.

    Attributes:
        tok_s: (low, high) decode tokens/s at the low and high acceptance rate.
        acceptance: the acceptance rates of the range.
        n_draft: tokens drafted per step.
        plain_tok_s: the main model's decode tokens/s without a draft.
        draft_tok_s: the draft's own decode tokens/s.
        assumptions: the assumptions, in words.
    """

    tok_s: tuple[float, float]
    acceptance: tuple[float, float]
    n_draft: int
    plain_tok_s: float
    draft_tok_s: float
    assumptions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "tok_s": list(self.tok_s),
            "acceptance": list(self.acceptance),
            "n_draft": self.n_draft,
            "plain_tok_s": self.plain_tok_s,
            "draft_tok_s": self.draft_tok_s,
            "assumptions": list(self.assumptions),
        }


def tokens_per_step(alpha: float, n_draft: int) -> float:
    """Expected tokens a step yields: ``(1 - alpha^(n+1)) / (1 - alpha)`` (``n + 1`` at alpha 1)."""
    if alpha >= 1.0:
        return float(n_draft + 1)
    return (1.0 - alpha ** (n_draft + 1)) / (1.0 - alpha)


def speculative_speed(
    main_decode_tok_s: float,
    main_prefill_tok_s: float,
    draft_decode_tok_s: float,
    *,
    n_draft: int = DEFAULT_DRAFT_N_MAX,
    acceptance: tuple[float, float] = DEFAULT_ACCEPTANCE,
) -> SpeculativeSpeed:
    """Speculative decoding's tokens/s over ``acceptance`` (see the module docstring).

    Raises:
        ValueError: a speed that is not positive, or an acceptance rate outside 0..1.
    """
    if min(main_decode_tok_s, main_prefill_tok_s, draft_decode_tok_s) <= 0:
        raise ValueError("speeds must be positive")
    if not all(0.0 <= a <= 1.0 for a in acceptance):
        raise ValueError("acceptance rates are between 0 and 1")
    verify_s = max(1.0 / main_decode_tok_s, (n_draft + 1) / main_prefill_tok_s)
    step_s = n_draft / draft_decode_tok_s + verify_s
    lo, hi = (tokens_per_step(a, n_draft) / step_s for a in acceptance)
    return SpeculativeSpeed(
        (lo, hi),
        acceptance,
        n_draft,
        main_decode_tok_s,
        draft_decode_tok_s,
        (
            f"acceptance {acceptance[0]:g}-{acceptance[1]:g} per drafted token (a setting; Leviathan et al. 2023)",
            f"{n_draft} tokens drafted per step (--spec-draft-n-max{' default' if n_draft == DEFAULT_DRAFT_N_MAX else ''})",
            (
                "checking them costs one main-model batch of n+1 tokens: the slower of a decode step and n+1 tokens "
                "at the prefill rate"
            ),
        ),
    )


def image_encode_s(projector_flops: int, main_prefill_tok_s: float, main_flops_per_token: float) -> float:
    """Seconds to encode one image: the projector's operations at the rate the main model's
    prefill reaches (``prefill tok/s x 2 x main weights`` operations per second), the same
    backend and batch-size class (hundreds of patches, like a prompt's tokens).

    Raises:
        ValueError: a rate that is not positive.
    """
    if main_prefill_tok_s <= 0 or main_flops_per_token <= 0:
        raise ValueError("rates must be positive")
    return projector_flops / (main_prefill_tok_s * main_flops_per_token)
