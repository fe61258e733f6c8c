"""Host time per call of tritonkit ops and their layers, on shapes too small for the GPU to matter.

Each line is wall time per call over many back-to-back calls (the GPU keeps up, so the host is the
bottleneck). Run on a CUDA machine: `PYTHONPATH=src python3 benchmarks/host_overhead.py`.

`--steps` looks at whole RMSNorm fwd+bwd steps instead, for tritonkit, liger-kernel (when installed)
and torch.compile: wall time per step, the host's time to issue one (if that nears the wall time,
something in the step waits for the GPU) and the CUDA runtime calls that block the host.

`--decode` takes an eager decode_attention call apart (B1 S1k, paged bf16, GQA 32:8, d128, the GPU's plan): the
public op, its validation alone, its launcher with the plan's programmatic launches and without, with one split
(no reduction launch) and with the heuristic's; then a W8A16 QuantizedLinear at one token, SDPA and a bf16 Linear.
Host time of one call, each after a synchronisation (min and median of 400), twice.
"""

import dataclasses
import statistics
import sys
import time

import torch
import triton

import tritonkit as tk
from tritonkit._core.device import arch
from tritonkit.ops.norm.kernels import _norm_fwd_kernel, _rms_norm_fwd_looped_kernel
from tritonkit.ops.norm.op import norm_op
from tritonkit.ops.norm.plan import FwdLoopedPlan, loads_weight_first, norm_fwd_plan
from tritonkit.ops.row_softmax.kernels import _softmax_fwd_kernel
from tritonkit.ops.row_softmax.launch import softmax_bwd, softmax_fwd
from tritonkit.ops.tutorial.kernels import _add_kernel


def per_call_us(fn, calls=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y, rstd = torch.empty_like(x), torch.empty(8, device="cuda")
    plan = norm_fwd_plan(4096, 2, True, arch(x.device))  # the launcher's: RMSNorm
    flags = dict(HAS_RES=False, HAS_W=True, HAS_B=False, STORE_H=False, STORE_STATS=True)

    # The kernel the plan names, launched as norm_fwd launches it (y stands in for the absent h, rstd for the mean)
    if isinstance(plan, FwdLoopedPlan):

        def raw_norm_launch():
            _rms_norm_fwd_looped_kernel[(8,)](
                x, x, w, x, y, y, rstd, 4096, 4096, 0, 4096, 0, 1e-6, 0.0, **flags, BLOCK_N=plan.chunk,
                LOOP_STAGES=plan.stages, num_warps=plan.warps,
            )  # fmt: skip

    else:

        def raw_norm_launch():
            _norm_fwd_kernel[(triton.cdiv(8, plan.rows),)](
                x, x, w, x, y, y, rstd, rstd, 8, 4096, 4096, 0, 4096, 0, 1e-6, 0.0, IS_RMS=True, **flags,
                ROWS=plan.rows, BLOCK_N=4096, WEIGHT_FIRST=loads_weight_first(plan.rows, 4096, plan.warps),
                num_warps=plan.warps,
            )  # fmt: skip

    a = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    xg = x.clone().requires_grad_()
    rows = [
        ("torch: a + a", lambda: a + a),
        ("torch: F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)),
        (
            "triton launch: _add_kernel",
            lambda: _add_kernel[(4,)](a, a, out, 4096, APPLY_RELU=False, BLOCK_SIZE=1024),
        ),
        ("tk.ops.add", lambda: tk.ops.add(a, a)),
        ("triton launch: norm forward kernel", raw_norm_launch),
        ("custom op: norm_fwd", lambda: norm_op.forward_op(x, w, None, None, 1e-6, 0.0, True, False, False)),
        ("tk.ops.rms_norm", lambda: tk.ops.rms_norm(x, w)),
        ("tk.ops.rms_norm, x requires grad", lambda: tk.ops.rms_norm(xg, w)),
    ]
    rows += _softmax_rows(xg)
    rows += _direct_launch_rows(x)
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for label, fn in rows:
        print(f"{label:<36} {per_call_us(fn):7.1f} us/call")


class _TorchSoftmaxFunction(torch.autograd.Function):
    """torch's softmax kernels behind a Python autograd.Function: what the Function layer alone costs."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return torch._softmax_backward_data(dy, y, -1, dy.dtype)


class _TorchSoftmaxTwoOutputs(torch.autograd.Function):
    """As _TorchSoftmaxFunction, with a second, non-differentiable output (as tritonkit's lse)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, -1)
        lse = torch.logsumexp(x.float(), -1)
        ctx.save_for_backward(y)
        ctx.mark_non_differentiable(lse)
        return y, lse

    @staticmethod
    def backward(ctx, dy, dlse):
        (y,) = ctx.saved_tensors
        return torch._softmax_backward_data(dy, y, -1, dy.dtype)


class _LaunchersOneOutput(torch.autograd.Function):
    """tritonkit's softmax launchers behind a Function with one output (lse kept on ctx)."""

    @staticmethod
    def forward(ctx, x):
        y, lse = softmax_fwd(x, False)
        ctx.save_for_backward(x)
        ctx.lse = lse
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return softmax_bwd(dy, x, ctx.lse, False)


def _softmax_rows(xg):
    """A softmax fwd+bwd step of 8 x 4096 bf16, taken apart: torch's ops, the same ops behind a Python
    autograd.Function, tritonkit's two launches without autograd, and tritonkit's op."""
    dy = torch.randn_like(xg)
    x = xg.detach()

    def launches_only():
        _, lse = softmax_fwd(x, False)
        return softmax_bwd(dy, x, lse, False)

    return [
        ("fwd+bwd: torch.softmax", lambda: torch.autograd.grad(torch.softmax(xg, -1), xg, dy)),
        ("fwd+bwd: Function over torch kernels", lambda: torch.autograd.grad(_TorchSoftmaxFunction.apply(xg), xg, dy)),
        ("fwd+bwd: same, two outputs", lambda: torch.autograd.grad(_TorchSoftmaxTwoOutputs.apply(xg)[0], xg, dy)),
        ("fwd+bwd: tk softmax launchers only", launches_only),
        ("fwd+bwd: Function over tk launchers", lambda: torch.autograd.grad(_LaunchersOneOutput.apply(xg), xg, dy)),
        ("fwd: tk.ops.softmax, x requires grad", lambda: tk.ops.softmax(xg)),
        ("fwd+bwd: tk.ops.softmax", lambda: torch.autograd.grad(tk.ops.softmax(xg), xg, dy)),
    ]


def _direct_launch_rows(x):
    """One launch of the softmax forward kernel (8 x 4096 bf16) three ways: through the JIT function
    (triton binds and specialises the arguments each call), through the compiled kernel's launcher, and
    through its raw ``run`` with the stream looked up once: what a launch cache could save per launch."""
    y, lse = torch.empty_like(x), torch.empty(8, device="cuda")
    args = (x, y, lse, 8, 4096, 4096, 4096)
    # In the kernel's order: the compiled kernel's launchers take them positionally
    constexprs = dict(LOG=False, GRID_LOOP=False, ROWS=1, BLOCK_N=4096, LOOP_STAGES=1, STORE_LSE=True)
    compiled = _softmax_fwd_kernel[(8,)](*args, **constexprs, num_warps=8)
    full_args = (*args, *constexprs.values())
    stream = torch.cuda.current_stream().cuda_stream
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    return [
        ("launch: JIT function", lambda: _softmax_fwd_kernel[(8,)](*args, **constexprs, num_warps=8)),
        ("launch: CompiledKernel[grid]", lambda: compiled[(8, 1, 1)](*full_args)),
        ("launch: CompiledKernel.run", lambda: run(8, 1, 1, stream, function, metadata, None, None, None, *full_args)),
        ("current raw stream lookup", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("x.data_ptr() % 16", lambda: x.data_ptr() % 16),
    ]


def _issue_us(step, calls=50):
    """Host time to issue one step, with the GPU idle at the start of each."""
    total = 0.0
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        total += time.perf_counter() - start
    torch.cuda.synchronize()
    return total / calls * 1e6


def _blocking_calls(step):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    names = ("Synchronize", "Memcpy", "cudaFree", "cudaMalloc")
    counts = {}
    for event in prof.events():
        if event.name.startswith("cuda") and any(n in event.name for n in names):
            counts[event.name] = counts.get(event.name, 0) + 1
    kernels = sorted({e.name[:40] for e in prof.events() if e.device_type.name == "CUDA"})
    return {k: v / 5 for k, v in counts.items()}, kernels


def steps():
    providers = {"tritonkit": lambda x, w: tk.ops.rms_norm(x, w, eps=1e-6)}
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        providers["liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
    except ImportError:
        pass
    compiled = torch.compile(lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6))
    providers["torch.compile"] = compiled
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for dtype in (torch.bfloat16, torch.float32):
        for rows, n in ((8, 4096), (16384, 4096)):
            x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(rows, n, device="cuda", dtype=dtype)
            for name, fn in providers.items():

                def step(fn=fn, x=x, w=w, dy=dy):
                    x.grad = w.grad = None
                    fn(x, w).backward(dy)

                wall = per_call_us(step, calls=300)
                issue = _issue_us(step)
                blocking, kernels = _blocking_calls(step)
                print(
                    f"{dtype!s:15} {rows:6}x{n} {name:14} wall {wall:7.1f} us/step, issue {issue:7.1f} us, "
                    f"blocking per step {blocking or 'none'}"
                )
                print(f"{'':38}kernels: {kernels}")


def _host_us(fn, calls=400) -> str:
    for _ in range(50):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return f"min {min(times):7.1f}  median {statistics.median(times):7.1f} us"


# check_decode's arguments after the cache: no scales, the default scale, causal, no window or softcap, the
# heuristic's splits, value checks as the environment says.
CHECK_DEFAULTS = (None, None, None, True, -1, 0.0, 0, None)


def decode():
    import torch.nn.functional as F

    from tritonkit import catalog
    from tritonkit.ops.decoding import launch as decoding
    from tritonkit.ops.decoding.plan import decode_plan

    spec = catalog.get("decode_attention")
    case = spec.parse_case({"b": 1, "s": 1024, "hq": 32, "hk": 8, "d": 128, "page_size": 64})
    inputs = spec.make_inputs(case, torch.device("cuda"), torch.bfloat16, torch.Generator("cuda").manual_seed(1))
    q, k, v, lengths = inputs.args
    table = inputs.kwargs["block_table"]
    plan = decode_plan(arch(q.device), 128, "plain")
    plain = dataclasses.replace(plan, pdl=False)

    def launcher(plan, splits):
        return lambda: decoding.decode_attention_fwd(q, k, v, lengths, table, None, None, 0.088, True, -1, 0.0,
                                                     splits, plan=plan)  # fmt: skip

    linear = torch.nn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16)
    layer = tk.nn.QuantizedLinear.from_linear(linear, torch.int8, activations="weight_only")
    x = torch.randn(1, 1, 4096, device="cuda", dtype=torch.bfloat16)
    sdpa_q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    sdpa_kv = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)
    rows = {
        "op (public)": lambda: tk.ops.decode_attention(q, k, v, lengths, block_table=table),
        "validation only": lambda: decoding.check_decode(*(q, k, v, lengths, table), *CHECK_DEFAULTS),
        "launcher, plan (pdl)": launcher(plan, 0),
        "launcher, plain launches": launcher(plain, 0),
        "launcher, pdl, 1 split": launcher(plan, 1),
        "launcher, plain, 1 split": launcher(plain, 1),
        "QuantizedLinear W8A16 one row": lambda: layer(x),
        "SDPA, GQA": lambda: F.scaled_dot_product_attention(sdpa_q, sdpa_kv, sdpa_kv, enable_gqa=True),
        "bf16 Linear one row": lambda: linear(x),
    }
    with torch.no_grad():
        for _ in range(2):
            for name, fn in rows.items():
                print(f"{name:32} {_host_us(fn)}", flush=True)
            print()


if __name__ == "__main__":
    steps() if "--steps" in sys.argv else decode() if "--decode" in sys.argv else main()
