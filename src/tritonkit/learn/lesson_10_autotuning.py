"""Auto-tuning: what block sizes, num_warps and num_stages change, and triton.autotune choosing among them.

A Triton kernel leaves three kinds of choices to its launch, and the best values depend on the GPU and the shape.
The lesson's kernel is a plain matmul, C = A @ B, one [BLOCK_M, BLOCK_N] tile of C per program, walking K in
steps of BLOCK_K. (On a GPU, tl.dot multiplies float32 inputs as TF32, 10 mantissa bits: each element
of C is exact to about 2^-10 of sum_k |a_ik b_kj|, not to float32's precision.)

* Block sizes set the work of one program. A program loads BLOCK_M rows of A and BLOCK_N columns of B for
  each K step and reuses every loaded value BLOCK_N (or BLOCK_M) times, so the whole matmul loads
  M N K (1/BLOCK_M + 1/BLOCK_N) values from memory (or L2): larger tiles, less traffic. But a larger tile
  makes fewer programs: a 512 x 512 output in 128 x 256 tiles is 8 programs, and an H100 has 132 SMs,
  so 124 of them idle. The fp32 accumulator, BLOCK_M x BLOCK_N, lives in registers.
* num_warps is the number of 32-thread warps that run one program (4 by default). The same tile over more
  threads means fewer registers per thread: the accumulator alone is BLOCK_M BLOCK_N / (32 num_warps)
  floats a thread, and a thread has at most 255 registers; past that the compiler spills to slow local
  memory. More warps also hide more latency, and cost more synchronisation.
* num_stages is the depth of the software pipeline of the K loop: while the tensor cores multiply the
  tiles of step k, the loads of the next num_stages - 1 steps are already in flight, each into its own
  buffer in shared memory: num_stages (BLOCK_M + BLOCK_N) BLOCK_K elements. More stages hide more memory
  latency until shared memory (227 KiB per program on an H100) runs out, or fewer programs fit on an SM.

triton.autotune(configs, key) wraps a kernel with a list of triton.Config (block sizes as keyword arguments,
num_warps, num_stages). The first call with a new value of the key's arguments (here M, N, K) runs every
config (triton.testing.do_bench: warm-up, then repeats, the median), keeps the fastest, and launches it;
later calls with the same key launch the kept config at once. Each config runs on the real outputs, so a
kernel that adds into its output needs reset_to_zero (or restore_value); prune_configs_by drops configs
before timing. The autotuned kernel's grid is a function of the chosen block sizes: grid(meta).

Under the interpreter there is nothing to time: it runs each program's block operations with NumPy,
ignores num_warps and num_stages, and its speed says nothing about a GPU. So on the CPU the lesson
(1) runs the autotuner with a benchmark that runs each config once and reports the same time for all
(the first config wins), to show when it runs the configs and that each computes the same C;
(2) counts programs and traffic for each block size at two GPU-sized shapes; (3) compiles configs for
an H100 (sm_90), which needs no GPU (Triton's compiler and ptxas run on the CPU, in a separate process
without the interpreter), and reads what num_warps and num_stages did to the compiled code: shared
memory per program, registers per thread, bytes spilled. On a GPU it times every config at the two
shapes, shows the autotuner's choice for each, and with --out DIR plots the TFLOP/s.

The production op: tk.ops.matmul(a, b, variant="autotuned"), whose configs come from
tritonkit._core.gemm_plan.autotune_configs() (ten tiles on a GPU, shared with the fused LoRA GEMM, which adds two
of 16 rows; one under the interpreter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

from tritonkit._core.env import interpreting

H100_SMS = 132  # streaming multiprocessors of an H100 SXM: programs that run at once, one per SM at the least
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): one step at a time along each knob, from a small tile up.
SHAPES_OF_CONFIGS = (
    (64, 64, 32, 4, 1),
    (64, 64, 32, 4, 3),
    (64, 128, 32, 4, 3),
    (64, 128, 32, 8, 3),
    (128, 128, 64, 4, 3),
    (128, 256, 64, 8, 3),
)
MODULE = "tritonkit.learn.lesson_10_autotuning"  # what the compiling process imports (a notebook's __name__ is not it)
COMPILED_ON_CPU = 4  # the first configs, compiled for sm_90 under the interpreter (about a second each)
GPU_SHAPES = ((512, 512, 4096), (4096, 4096, 4096))  # (M, N, K): few tiles, then many


def config_name(shape: tuple) -> str:
    bm, bn, bk, warps, stages = shape
    return f"{bm}x{bn}x{bk} w{warps} s{stages}"


CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)
    for bm, bn, bk, warps, stages in SHAPES_OF_CONFIGS
]


@triton.jit
def matmul_kernel(p_a, p_b, p_c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ B for row-major A (M, K), B (K, N), C (M, N): tile (program_id(0), program_id(1)) of C is the sum over
    K steps of A[rows, k:k+BLOCK_K] @ B[k:k+BLOCK_K, cols], accumulated in fp32; values past M, N or K load as 0."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    p_a_tile = p_a + o_m.to(tl.int64)[:, None] * K + o_k[None, :]
    p_b_tile = p_b + o_k.to(tl.int64)[:, None] * N + o_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        b_a = tl.load(p_a_tile, mask=(o_m[:, None] < M) & (k + o_k[None, :] < K), other=0.0)  # [BLOCK_M, BLOCK_K]
        b_b = tl.load(p_b_tile, mask=(k + o_k[:, None] < K) & (o_n[None, :] < N), other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(b_a, b_b, acc)
        p_a_tile += BLOCK_K
        p_b_tile += BLOCK_K * N
    p_c_tile = p_c + o_m.to(tl.int64)[:, None] * N + o_n[None, :]
    tl.store(p_c_tile, acc.to(p_c.dtype.element_ty), mask=(o_m[:, None] < M) & (o_n[None, :] < N))


class ConfigRuns:
    """The configs the autotuner ran, in order (its pre_hook sees each config's arguments before each run)."""

    def __init__(self):
        self.runs: list[tuple] = []

    def __call__(self, nargs: dict, reset_only: bool = False) -> None:
        if not reset_only:
            self.runs.append(tuple(nargs[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")))


CONFIG_RUNS = ConfigRuns()


def interpreter_benchmark(kernel_call, quantiles):
    """The autotuner's benchmark under the interpreter: run the config once; report 0 ms for every config, since the
    interpreter's time says nothing about a GPU (ties go to the first config)."""
    kernel_call()
    return [0.0] * len(quantiles)


matmul_autotuned = triton.autotune(
    configs=CONFIGS, key=["M", "N", "K"], pre_hook=CONFIG_RUNS,
    do_bench=interpreter_benchmark if interpreting() else None,  # None: triton.testing.do_bench on the GPU
)(matmul_kernel)  # fmt: skip


def matmul(a, b, *, config: tuple | None = None):
    """a @ b through the autotuned kernel, or through the plain kernel with ``config`` (a SHAPES_OF_CONFIGS row)."""
    import torch

    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if config is None:
        matmul_autotuned[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))](
            a, b, c, m, n, k
        )
        return c
    bm, bn, bk, warps, stages = config
    matmul_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](a, b, c, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                            num_warps=warps, num_stages=stages)  # fmt: skip
    return c


# --------------------------------------------------------------------------------------------------
# Compiling without a GPU
# --------------------------------------------------------------------------------------------------
def _compile_configs(shapes: list[tuple], arch: int) -> list[dict]:
    """Compile matmul_kernel (bf16) for each config for the NVIDIA architecture ``arch`` (90: Hopper) and read the
    shared memory from Triton's metadata and the registers and spills from the cubin (cuobjdump). Pointers and
    sizes are taken as multiples of 16, as Triton specialises them at a launch with such sizes."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    signature = {"p_a": "*bf16", "p_b": "*bf16", "p_c": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                 "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}  # fmt: skip
    divisible = {(index,): [["tt.divisibility", 16]] for index in range(6)}
    report = []
    for bm, bn, bk, warps, stages in shapes:
        source = triton.compiler.ASTSource(fn=matmul_kernel, signature=signature, attrs=divisible,
                                           constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk})  # fmt: skip
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": warps, "num_stages": stages})  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            cubin = Path(folder) / "kernel.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            usage = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", str(cubin)], capture_output=True,
                                   text=True, check=True).stdout  # fmt: skip
        fields = dict(item.split(":") for item in usage.split("Function", 1)[1].split(":", 1)[1].split())
        report.append({"config": [bm, bn, bk, warps, stages], "shared": compiled.metadata.shared,
                       "registers": int(fields["REG"]), "spilled": int(fields["LOCAL"])})  # fmt: skip
    return report


def compile_report(shapes: list[tuple], arch: int = 90) -> list[dict]:
    """:func:`_compile_configs` in a fresh process without the interpreter (under it, Triton cannot compile)."""
    import tritonkit

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    package_root = str(Path(tritonkit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", MODULE, "--compile", json.dumps([list(s) for s in shapes]),
                           "--arch", str(arch)], env=env, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"compiling for sm_{arch} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------------------
# The lesson
# --------------------------------------------------------------------------------------------------
def _product_error(c, a, b, device: str) -> float:
    """C's largest error against float64 A @ B, after checking every element against its bound. On a GPU tl.dot
    takes float32 inputs as TF32 (10 explicit mantissa bits, each input rounded by up to 2^-11): an element may be off
    by 2^-10 of sum_k |a_ik b_kj|, and 2^-9 leaves room for the float32 sums. The interpreter computes in float32."""
    a, b = a.double(), b.double()
    error = (c.double() - a @ b).abs()
    bound = 1e-4 if device == "cpu" else 2.0**-9 * (a.abs() @ b.abs())
    assert (error <= bound).all(), f"an element beyond its bound: largest error {error.max().item():.2e}"
    return error.max().item()


def _chosen() -> str:
    """The name of the config the autotuner launched last."""
    chosen = matmul_autotuned.best_config.all_kwargs()
    return config_name(tuple(chosen[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")))


def _autotuner_mechanics(device: str, generator) -> None:
    import torch

    print("(1) triton.autotune over six configs, key = (M, N, K)")
    calls = ((96, 80, 64), (96, 80, 64), (40, 80, 64)) if device == "cpu" else ((512, 512, 512),) * 2
    expected_runs = (len(CONFIGS), 0, len(CONFIGS))  # a new key runs every config; a key seen before, none
    matmul_autotuned.cache.clear()  # the choices of an earlier run in this process
    for (m, n, k), expected in zip(calls, expected_runs, strict=False):
        a = torch.randn(m, k, device=device, generator=generator)
        b = torch.randn(k, n, device=device, generator=generator)
        CONFIG_RUNS.runs.clear()
        c = matmul(a, b)
        error = _product_error(c, a, b, device)
        ran = set(CONFIG_RUNS.runs)
        print(f"    M, N, K = {m}, {n}, {k}: ran {len(ran)} configs ({len(CONFIG_RUNS.runs)} runs), launched "
              f"{_chosen()}; max abs error against float64 {error:.1e}")  # fmt: skip
        assert len(ran) == expected, (ran, expected)
    if device == "cpu":
        print("    the second call had the same key and ran no config; a new M ran them all again")
        a = torch.randn(40, 64, device=device, generator=generator)
        b = torch.randn(64, 80, device=device, generator=generator)
        errors = [_product_error(matmul(a, b, config=shape), a, b, device) for shape in SHAPES_OF_CONFIGS]
        print(f"    every config computes the same C: largest error over the six {max(errors):.1e}")


def _block_sizes() -> None:
    print("\n(2) block sizes: programs, and values loaded per output, for a bf16 matmul")
    header = "".join(f"  {f'M = N = {m}: programs':>24}" for m, _, _ in GPU_SHAPES)
    print(f"    {'BLOCK_M x BLOCK_N x BLOCK_K':<28}{header}   loads per output value (K = 4096)")
    for bm, bn, bk in dict.fromkeys(s[:3] for s in SHAPES_OF_CONFIGS):
        programs = [triton.cdiv(m, bm) * triton.cdiv(n, bn) for m, n, _ in GPU_SHAPES]
        cells = "".join(f"  {f'{p} ({p / H100_SMS:.2f} per SM)':>24}" for p in programs)
        loads = 4096 * (1 / bm + 1 / bn)  # K (1/BLOCK_M + 1/BLOCK_N) values loaded per value of C
        print(f"    {f'{bm} x {bn} x {bk}':<28}{cells}   {loads:6.0f}")
    print(f"    an H100 has {H100_SMS} SMs: with fewer programs than that, some idle; larger tiles load less")


def _compiled(arch: int, shapes) -> list[dict]:
    print(f"\n(3) num_warps and num_stages in the compiled code, bf16 for sm_{arch} (compiled on this machine's CPU)")
    report = compile_report(list(shapes), arch)
    print(f"    {'config':<22} {'shared memory':>14} {'registers / thread':>19} {'spilled bytes':>14}")
    for row in report:
        print(f"    {config_name(tuple(row['config'])):<22} {row['shared']:>10} B   {row['registers']:>19}"
              f" {row['spilled']:>14}")  # fmt: skip
    for row in report:  # shared memory holds num_stages copies of an A tile and a B tile (one, unpipelined)
        bm, bn, bk, _, stages = row["config"]
        assert row["shared"] == max(stages, 1) * (bm + bn) * bk * 2, row
    print("    shared memory = num_stages x (BLOCK_M + BLOCK_N) x BLOCK_K x 2 bytes; twice the warps, about half the")
    print("    registers per thread")
    return report


def _measure_on_gpu(generator) -> dict:
    import torch

    print("\n(4) every config timed on this GPU (triton.testing.do_bench, median), TFLOP/s:")
    print(f"    {'config':<22}" + "".join(f"{f'{m} x {n} x {k}':>18}" for m, n, k in GPU_SHAPES))
    measured = {"shapes": GPU_SHAPES, "configs": [config_name(s) for s in SHAPES_OF_CONFIGS], "tflops": {},
                "chosen": {}}  # fmt: skip
    inputs = {}
    for m, n, k in GPU_SHAPES:
        a = torch.randn(m, k, device="cuda", generator=generator, dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", generator=generator, dtype=torch.bfloat16)
        inputs[(m, n, k)] = (a, b)
        expected = a.float() @ b.float()
        for shape in SHAPES_OF_CONFIGS:
            error = (matmul(a, b, config=shape).float() - expected).abs().max().item()
            assert error < 0.05 * expected.abs().max().item(), (shape, error)
            ms = triton.testing.do_bench(lambda a=a, b=b, shape=shape: matmul(a, b, config=shape))
            measured["tflops"].setdefault(config_name(shape), []).append(2 * m * n * k / ms / 1e9)
    for name, row in measured["tflops"].items():
        print(f"    {name:<22}" + "".join(f"{value:>18.0f}" for value in row))
    for shape, (a, b) in inputs.items():
        matmul(a, b)
        chosen = _chosen()
        measured["chosen"][shape] = chosen
        print(f"    the autotuner chose {chosen} for M, N, K = {shape}")
    return measured


def plot(measured: dict, out_dir: str) -> Path:
    from tritonkit.learn import pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, len(measured["shapes"]), figsize=(12, 4.5))
    for index, (ax, shape) in enumerate(zip(axes, measured["shapes"], strict=True)):
        values = [measured["tflops"][name][index] for name in measured["configs"]]
        colours = ["C1" if name == measured["chosen"][shape] else "C0" for name in measured["configs"]]
        ax.barh(measured["configs"], values, color=colours)
        ax.invert_yaxis()
        ax.set_xlabel("TFLOP/s (bf16)")
        ax.set_title(f"M, N, K = {shape}: the autotuner's choice in orange")
    return save_figure(fig, out_dir, "autotuning.png")


def run(out_dir: str | None = None) -> None:
    import torch

    import tritonkit as tk

    device = "cpu" if interpreting() else "cuda"
    generator = torch.Generator(device=device).manual_seed(0)
    _autotuner_mechanics(device, generator)
    _block_sizes()
    if device == "cpu":
        _compiled(90, SHAPES_OF_CONFIGS[:COMPILED_ON_CPU])
        print("\n(4) timing needs a GPU: on one, this lesson times every config and plots them (--out DIR)")
    else:
        major, minor = torch.cuda.get_device_capability()
        _compiled(10 * major + minor, SHAPES_OF_CONFIGS)
        measured = _measure_on_gpu(generator)
        if out_dir:
            plot(measured, out_dir)
    a = torch.randn(100, 70, device=device, generator=generator)
    b = torch.randn(70, 90, device=device, generator=generator)
    error = _product_error(tk.ops.matmul(a, b, variant="autotuned"), a, b, device)
    print(f"\nThe production op: tk.ops.matmul(a, b, variant='autotuned'), max abs error {error:.1e} here")


if __name__ == "__main__":
    if "--compile" in sys.argv:
        shapes = [tuple(s) for s in json.loads(sys.argv[sys.argv.index("--compile") + 1])]
        print(json.dumps(_compile_configs(shapes, int(sys.argv[sys.argv.index("--arch") + 1]))))
    else:
        run()
