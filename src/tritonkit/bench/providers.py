"""Who runs a spec in a benchmark: tritonkit, torch eager (the spec's reference), torch.compile of the
reference, and peer libraries a spec names. A provider that cannot run is kept, with the reason."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tritonkit.registry import KernelSpec

BASE_PROVIDERS = ("tritonkit", "torch", "torch.compile")


# Peer libraries by name: the module that must import for the peer to run. Each spec maps the peers
# it can be compared with to a factory for the peer's version of its op (next to the op's code, or in
# tritonkit.bench.attention_peers, decoding_peers, gemm_peers and fourbit_peers for torch's own kernels, which no
# family may import from another).
PEERS: dict[str, str] = {
    "liger": "liger_kernel",
    "sdpa-flash": "torch",  # scaled_dot_product_attention, FlashAttention-2 backend forced
    "sdpa-cudnn": "torch",  # scaled_dot_product_attention, cuDNN backend forced
    "flex": "torch",  # FlexAttention, compiled
    "sdpa": "torch",  # scaled_dot_product_attention with enable_gqa, torch's choice of backend (decoding)
    "scaled_mm": "torch",  # torch._scaled_mm, float8 (cuBLASLt)
    "int_mm": "torch",  # torch._int_mm, then the scales
    "int_mm_bare": "torch",  # torch._int_mm alone: the unscaled int32 product (a timing floor)
    "cublas": "torch",  # F.linear on dense operands of the same shape
    "dequantize-cublas": "torch",  # a 4-bit weight dequantized by tritonkit, then F.linear
    "compiled-dequantize": "torch",  # torch.compile of a 4-bit weight's plain dequantization and F.linear
    "bitsandbytes": "bitsandbytes",  # bitsandbytes.matmul_4bit
    "xformers": "xformers",  # xFormers' Triton split-K decoding kernel (Flash-Decoding)
    "torchao": "torchao",  # torchao's Triton block-scaled float8 GEMM (DeepSeek-V3's kernel)
}
# Providers that run through torch.compile: the harness resets dynamo before each case, so that no recompile limit
# silently falls back to eager (for FlexAttention, a kernel that forms every score).
COMPILED = ("torch.compile", "flex", "compiled-dequantize")


@dataclass(frozen=True)
class Provider:
    name: str
    fn: Callable | None
    skip_reason: str | None = None

    @property
    def is_baseline(self) -> bool:
        return self.name != "tritonkit"


def _module_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _compiled(reference: Callable) -> Callable:
    import torch

    # The harness's "bwd" mode runs one autograd graph's backward many times (retain_graph=True), which a
    # compiled backward that donates its saved buffers refuses. Donation saves memory, not time.
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    return torch.compile(reference)


def select_providers(spec: KernelSpec, wanted: Sequence[str] | None = None,
                     cuda_graph: bool = False) -> list[Provider]:  # fmt: skip
    """The providers of ``spec``, in a fixed order, filtered by ``wanted`` (all when None).

    Unknown names in ``wanted`` raise ValueError. Peers that are not installed, that lack this op, or whose
    factory fails come back with ``fn=None`` and the reason. With ``cuda_graph``, so do peers whose function says it
    fails capture (a ``fails_graph_capture`` attribute, the reason): a capture that fails can leave the process unable
    to capture again (seen: every later case of the run failed), so such a peer is not tried.
    """
    known = (*BASE_PROVIDERS, *spec.peers)
    if wanted:
        unknown = [name for name in wanted if name not in (*BASE_PROVIDERS, *PEERS)]
        if unknown:
            raise ValueError(f"unknown providers {unknown}; known: {[*BASE_PROVIDERS, *PEERS]}")
    chosen = [name for name in known if not wanted or name in wanted]
    providers = []
    for name in chosen:
        if name == "tritonkit":
            providers.append(Provider(name, spec.timed or spec.fn))
        elif name == "torch":
            providers.append(Provider(name, spec.reference))
        elif name == "torch.compile":
            providers.append(Provider(name, _compiled(spec.reference)))
        elif name not in PEERS:
            providers.append(Provider(name, None, f"no peer named {name!r} is known to tritonkit.bench"))
        elif not _module_available(PEERS[name]):
            providers.append(Provider(name, None, f"{PEERS[name]} is not installed"))
        else:
            try:
                fn = spec.peers[name]()
            except Exception as error:  # a peer this torch lacks (no FlexAttention) is reported, not fatal
                providers.append(Provider(name, None, f"could not be set up: {type(error).__name__}: {error}"))
                continue
            fails_capture = getattr(fn, "fails_graph_capture", None) if cuda_graph else None
            if fails_capture:
                providers.append(Provider(name, None, f"not timed under CUDA graphs: {fails_capture}; time it "
                                                      "without --cuda-graph"))  # fmt: skip
            else:
                providers.append(Provider(name, fn))
    if wanted:
        for name in wanted:
            if name not in known:
                providers.append(Provider(name, None, f"{spec.name} does not list {name} as a peer"))
    return providers
