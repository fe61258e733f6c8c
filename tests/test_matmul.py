"""Matmul specifics: variants agree, grouped order, precision switch, bad input, gradients by the ladder itself."""

import pytest
import torch

import tritonkit as tk
from helpers import assert_compiled_matches_eager
from tritonkit._core.gemm_plan import autotune_configs, input_precision
from tritonkit.ops.tutorial.plan import choose_matmul_variant


@pytest.mark.parametrize(
    ("variant", "group_size"),
    [
        ("naive", None),
        ("grouped", None),
        ("grouped", 1),
        ("grouped", 3),
        ("autotuned", None),
        ("auto", None),
        ("persistent", None),
    ],
)
def test_variants_and_group_sizes(variant, group_size, device):
    a = torch.randn(150, 70, device=device)
    b = torch.randn(70, 130, device=device)
    c = tk.ops.matmul(a, b, variant=variant, group_size=group_size)
    torch.testing.assert_close(c, (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-4)


def test_output_dtype_follows_input(device):
    a = torch.randn(20, 30, device=device, dtype=torch.bfloat16)
    b = torch.randn(30, 10, device=device, dtype=torch.bfloat16)
    assert tk.ops.matmul(a, b).dtype == torch.bfloat16


def test_k_zero_gives_zeros(device):
    c = tk.ops.matmul(torch.randn(4, 0, device=device), torch.randn(0, 3, device=device))
    assert c.shape == (4, 3) and torch.equal(c, torch.zeros(4, 3, device=device))


@pytest.mark.parametrize(
    ("shape", "dtype", "through_tma"),
    [((70, 48, 64), torch.float32, True), ((100, 72, 40), torch.bfloat16, True), ((100, 70, 50), torch.float32, False),
     ((33, 40, 24), torch.float16, True), ((33, 40, 20), torch.bfloat16, False)],
)  # fmt: skip
@pytest.mark.parametrize("b_layout", ["row-major", "weight"])
def test_persistent_variant_takes_tma_where_rows_are_aligned(shape, dtype, through_tma, b_layout, device,
                                                              monkeypatch):  # fmt: skip
    """Rows of 16-byte multiples go through the TMA kernel; others (an fp32 row of 50 values, 200 bytes; a bf16 row of
    20, 40 bytes) fall back to the variant auto picks, with the same result."""
    from tritonkit.ops.tutorial import launch

    calls = []
    original = launch._matmul_persistent
    monkeypatch.setattr(launch, "_matmul_persistent", lambda *args: calls.append(1) or original(*args))
    m, n, k = shape
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype) if b_layout == "row-major" else torch.randn(n, k, device=device).to(
        dtype).t()  # fmt: skip
    c = tk.ops.matmul(a, b, variant="persistent")
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2 * k**0.5)
    assert bool(calls) == through_tma


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("b_layout", ["row-major", "weight"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_persistent_tiles_plain_and_swapped_match_float64(swap_ab, b_layout, dtype, device, monkeypatch):
    """A tile computed as C^T = B^T A^T (swap_ab) and stored transposed gives C, for both layouts of B, with ragged
    edges in M, N and K (40 x 96 by 96 x 200 in 16 x 64 x 64 tiles: 3 x 4 tiles, the last K step half empty)."""
    from tritonkit.ops.tutorial import launch
    from tritonkit.ops.tutorial.launch import matmul_fwd
    from tritonkit.ops.tutorial.plan import PersistentTile

    tiles = []
    original = launch._matmul_persistent
    monkeypatch.setattr(launch, "_matmul_persistent", lambda *args: tiles.append(args[3]) or original(*args))

    m, n, k = 40, 200, 96
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype) if b_layout == "row-major" else torch.randn(n, k, device=device).to(
        dtype).t()  # fmt: skip
    c = matmul_fwd(a, b, "persistent", None, plan=PersistentTile(16, 64, 64, 4, 2, 2, swap_ab=swap_ab))
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2)
    assert [tile.swap_ab for tile in tiles] == [swap_ab]


def test_persistent_tiles_by_rows_fill_the_multiprocessors(monkeypatch):
    """The widest tile of M's class whose output has at least half a tile per multiprocessor (132: an H100 or H200),
    else the narrowest; fp32 its own tile; none before Hopper."""
    from tritonkit.ops.tutorial import plan

    monkeypatch.setattr(plan, "kernels_interpreted", lambda: False)
    few, many = (tiles for _, tiles in plan.PERSISTENT_SM90_BY_ROWS)

    def tile(m, n):
        return plan.persistent_tile("sm90", 2, m, n, 132)

    assert [tile(16, n) for n in (14336, 28672, 8192, 4096, 3584, 100)] == [few[0], few[0], few[1], few[2], few[2],
                                                                            few[2]]  # fmt: skip
    assert tile(1, 4096) == tile(16, 4096) and tile(17, 4096) == many[-1]
    assert [tile(128, n) for n in (28672, 18944, 14336, 8192, 4096)] == [many[0], many[0], many[1], many[2], many[3]]
    assert tile(1024, 4096) == tile(8192, 8192) == plan.PERSISTENT_SM90
    assert all(t.swap_ab for t in few) and not any(t.swap_ab for t in many)
    assert plan.persistent_tile("sm90", 4, 16, 4096, 132) == plan.PERSISTENT_SM90_FP32
    assert plan.persistent_tile("sm80", 2, 16, 4096, 108) is None


def test_auto_variant_and_precision_rules(monkeypatch):
    from tritonkit.ops.tutorial import plan

    assert choose_matmul_variant("sm90", 2, True) == "grouped"  # under the interpreter
    monkeypatch.setattr(plan, "kernels_interpreted", lambda: False)
    assert choose_matmul_variant("sm90", 2, True) == "persistent"
    assert choose_matmul_variant("sm90", 4, True) == "autotuned"  # fp32: the persistent tile was never timed
    assert choose_matmul_variant("sm90", 2, False) == "autotuned"  # operands TMA cannot read
    assert choose_matmul_variant("sm80", 2, True) == "autotuned"
    monkeypatch.undo()
    assert len(autotune_configs()) == 1
    assert input_precision(torch.bfloat16) == "tf32"
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert input_precision(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert input_precision(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(previous)


BAD = [
    (
        lambda d: tk.ops.matmul(torch.ones(2, 3, device=d), torch.ones(4, 2, device=d)),
        ValueError,
        r"a's columns must equal b's rows, got a of shape \(2, 3\) and b of shape \(4, 2\)",
    ),
    (
        lambda d: tk.ops.matmul(torch.ones(2, 3, 4, device=d), torch.ones(4, 2, device=d)),
        ValueError,
        "a must have 2 dimensions, got 3",
    ),
    (
        lambda d: tk.ops.matmul(torch.ones(2, 3, device=d), torch.ones(3, 2, device=d, dtype=torch.float16)),
        TypeError,
        "a and b must have the same dtype",
    ),
    (
        lambda d: tk.ops.matmul(torch.ones(2, 3, device=d, dtype=torch.int64), torch.ones(3, 2, device=d)),
        TypeError,
        "a must have dtype in",
    ),
    (
        lambda d: tk.ops.matmul(torch.ones(2, 3, device=d), torch.ones(3, 2, device=d), variant="fast"),
        ValueError,
        "variant must be one of .*got 'fast'",
    ),
    (
        lambda d: tk.ops.matmul(torch.ones(2, 3, device=d), torch.ones(3, 2, device=d), group_size=4),
        ValueError,
        "group_size applies to variant='grouped' only, got variant='auto'",
    ),
    (
        lambda d: tk.ops.matmul(
            torch.ones(2, 3, device=d), torch.ones(3, 2, device=d), variant="grouped", group_size=0
        ),
        ValueError,
        "group_size must be positive, got 0",
    ),
]


@pytest.mark.parametrize(("fn", "error", "match"), BAD, ids=[m[:30] for _, _, m in BAD])
def test_bad_input(fn, error, match, device):
    with pytest.raises(error, match=match):
        fn(device)


@pytest.mark.gpu
def test_auto_is_persistent_on_hopper_and_autotuned_elsewhere_when_compiled(monkeypatch):
    from tritonkit._core.device import arch
    from tritonkit._core.tma import has_tma

    gpu = arch(torch.device("cuda"))
    assert choose_matmul_variant(gpu, 2, True) == ("persistent" if has_tma(gpu) else "autotuned")
    assert choose_matmul_variant(gpu, 4, True) == "autotuned"
    monkeypatch.delenv("TRITONKIT_AUTOTUNE", raising=False)
    assert len(autotune_configs()) == 10
    monkeypatch.setenv("TRITONKIT_AUTOTUNE", "quick")  # what scripts/gpu_verify.sh sets
    assert len(autotune_configs()) == 2
    a = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(tk.ops.matmul(a, b).float(), (a.double() @ b.double()).float(), rtol=8e-3, atol=0.2)


# --------------------------------------------------------------------------------------------------
# Gradients: the ladder differentiates with itself
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["naive", "grouped", "autotuned", "auto"])
@pytest.mark.parametrize("layout", ["plain", "a-transposed", "b-transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gradients_match_float64(variant, layout, dtype, device):
    """d(a) = d(c) b^T and d(b) = a^T d(c) under a random upstream gradient, against float64 torch (they used to
    vanish: the product had no graph). The tolerance grows like sqrt(K) of each product."""
    m, k, n = 37, 50, 29
    a = torch.randn(k, m, device=device).t() if layout == "a-transposed" else torch.randn(m, k, device=device)
    b = torch.randn(n, k, device=device).t() if layout == "b-transposed" else torch.randn(k, n, device=device)
    a, b = a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()
    exact = [t.detach().double().requires_grad_() for t in (a, b)]
    c = tk.ops.matmul(a, b, variant=variant)
    upstream = torch.randn(m, n, device=device).to(dtype)
    grads = torch.autograd.grad(c, (a, b), upstream)
    expected = torch.autograd.grad(exact[0] @ exact[1], exact, upstream.double())
    base = 1e-5 if dtype == torch.float32 else 8e-3
    for grad, theirs, t, inner in zip(grads, expected, (a, b), (n, m), strict=True):
        assert grad.dtype == dtype and grad.shape == t.shape
        torch.testing.assert_close(grad.double(), theirs, rtol=base, atol=base * inner**0.5)


def test_gradient_of_one_input_only_and_double_backward(device):
    a = torch.randn(9, 6, device=device, requires_grad=True)
    b = torch.randn(6, 5, device=device)
    c = tk.ops.matmul(a, b, variant="grouped", group_size=2)
    g = torch.randn(9, 5, device=device, requires_grad=True)
    (grad_a,) = torch.autograd.grad(c, a, g, create_graph=True)
    torch.testing.assert_close(grad_a, g.detach() @ b.t(), rtol=1e-5, atol=1e-5)
    v = torch.randn(9, 6, device=device)
    (second,) = torch.autograd.grad((grad_a * v).sum(), g)  # d<g b^T, v>/dg = v b
    torch.testing.assert_close(second, v @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["naive", "grouped", "auto"])
def test_compiles_fullgraph_with_backward(variant, device):
    def block(a, b):
        return (tk.ops.matmul(a * 2, b, variant=variant) * torch.arange(7, device=a.device)).sum()

    inputs = [torch.randn(12, 10, device=device, requires_grad=True), torch.randn(10, 7, device=device,
                                                                                   requires_grad=True)]  # fmt: skip
    assert_compiled_matches_eager(block, inputs, device)


def test_matmul_tiles_sweep_runs_every_candidate_dry(tmp_path, capsys):
    """benchmarks/matmul_tiles.py's CPU check: every candidate tile through plan= within a bf16 ulp of float64."""
    from helpers import benchmark_script

    script = benchmark_script("matmul_tiles")
    assert script.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("max abs error") == len(script.CANDIDATES)
    timed = (("torch", 2.0), ("tritonkit", 1.0))
    rows = [{"case": {"m": 16, "n": n, "k": k}, "provider": p, "ms": ms} for n, k in script.LLM_NK for p, ms in timed]
    summary = script.summary({"results": rows})
    assert f"| 16 | tritonkit | 2.00x | {len(script.LLM_NK)} |" in summary
