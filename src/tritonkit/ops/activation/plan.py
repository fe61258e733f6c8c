"""Launch plans of the activations: the shared elementwise launcher's block, by device architecture.

No activation plan was swept apart from the copy's: sm90 takes the block that moved a 64 MB bf16 copy fastest (1024
elements a program), at which the gated activations run near the copy ceiling (docs/kernels/activation.md). Other
architectures fall back to the same block.
"""

from __future__ import annotations

from tritonkit._core.elementwise import FALLBACK_PLAN, ElementwisePlan

MEASURED = {"sm90": ElementwisePlan(block_size=1024, warps=4)}


def activation_plan(arch: str) -> ElementwisePlan:
    """The measured plan for ``arch``, else the elementwise fallback."""
    return MEASURED.get(arch, FALLBACK_PLAN)
