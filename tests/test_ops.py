"""Every registered op, every test case, every dtype: fresh inputs, poisoned outputs, float64 reference."""

import subprocess
import sys

import pytest
import torch

from tritonkit import catalog, registry, testing
from tritonkit.registry import KernelSpec


def _params(cases: str, with_grad_modes: bool = False, every_dtype: bool = True) -> list:
    """(spec, case, dtype[, grad mode]) for every registered spec, over ``spec.<cases>``; with grad modes only for
    specs that have a backward: a random upstream gradient, and sum()'s stride-0 one in the spec's main 16-bit dtype
    (bf16 where it takes it: how a launcher reads an expanded gradient does not depend on the dtype). Not
    ``every_dtype`` (the CPU suite's gradients): fp32 and that 16-bit dtype only, fp16 and bf16 taking the same
    kernels; with the sums in every dtype the gradients were a third of CI's time under the interpreter."""
    params = []
    for spec in catalog.all_specs():
        if with_grad_modes and not spec.has_backward:
            continue
        main16 = next((d for d in (torch.bfloat16, torch.float16) if d in spec.dtypes), spec.dtypes[0])
        for case in getattr(spec, cases):
            for dtype in spec.dtypes:
                label = f"{spec.name}-{spec.case_id(case)}-{str(dtype).removeprefix('torch.')}"
                if not with_grad_modes:
                    params.append(pytest.param(spec, case, dtype, id=label))
                    continue
                if not every_dtype and dtype.itemsize == 2 and dtype != main16:
                    continue
                modes = [m for m in testing.GRAD_MODES if m != "sum" or dtype == main16]
                params += [pytest.param(spec, case, dtype, m, id=f"{label}-{m}") for m in modes]
    return params


PARAMS = _params("test_cases")
GPU_PARAMS = _params("gpu_cases")
GRAD_PARAMS = _params("test_cases", with_grad_modes=True, every_dtype=False)
GPU_GRAD_PARAMS = _params("gpu_cases", with_grad_modes=True)


@pytest.mark.parametrize(("spec", "case", "dtype"), PARAMS)
def test_matches_reference(spec, case, dtype, device):
    result = testing.run_case(spec, case, dtype, device)
    assert result.ok, result.explain()


@pytest.mark.gpu
@pytest.mark.parametrize(("spec", "case", "dtype"), GPU_PARAMS)
def test_matches_reference_compiled(spec, case, dtype):
    result = testing.run_case(spec, case, dtype, "cuda")
    assert result.ok, result.explain()


@pytest.mark.parametrize(("spec", "case", "dtype", "grad_mode"), GRAD_PARAMS)
def test_gradients_match_reference(spec, case, dtype, grad_mode):
    result = testing.run_case(spec, case, dtype, "cpu", grad_mode=grad_mode)
    assert result.ok, result.explain()


@pytest.mark.gpu
@pytest.mark.parametrize(("spec", "case", "dtype", "grad_mode"), GPU_GRAD_PARAMS)
def test_gradients_match_reference_compiled(spec, case, dtype, grad_mode):
    result = testing.run_case(spec, case, dtype, "cuda", grad_mode=grad_mode)
    assert result.ok, result.explain()


# The checker itself must fail wrong kernels; otherwise the tests above prove nothing.
def _broken_spec(fn):
    from tritonkit.ops import add

    base = catalog.get("add")
    return KernelSpec(**{**base.__dict__, "name": "broken", "fn": lambda x, y: fn(add, x, y)})


def _skip_last(add, x, y):
    out = add(x, y)
    poisoned = torch.full_like(out, float("nan"))  # what a poisoned allocation holds
    poisoned[:-1] = out[:-1]  # the last element is never written
    return poisoned


@pytest.mark.parametrize(
    ("label", "fn"),
    [
        ("off by 2 percent", lambda add, x, y: add(x, y) * 1.02),
        ("last element unwritten", _skip_last),
        ("dropped operand", lambda add, x, y: add(x, torch.zeros_like(y))),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checker_catches_wrong_kernels(label, fn, dtype):
    result = testing.run_case(_broken_spec(fn), {"n": 4097}, dtype, "cpu")
    assert not result.ok, label


def test_compare_reports_errors():
    tol = registry.TOLERANCES[torch.float32]
    ref = torch.tensor([1.0, 2.0, float("nan"), float("inf")], dtype=torch.float64)
    same = testing.compare(ref.float(), ref, tol)
    assert same.ok and same.max_abs_err == 0.0
    off = testing.compare(torch.tensor([1.0, 2.5, float("nan"), float("inf")]), ref, tol)
    assert not off.ok and off.n_bad == 1 and off.first_bad == (1,) and off.max_abs_err == 0.5
    assert off.max_rel_err == 0.25
    nan_where_finite = testing.compare(torch.tensor([float("nan"), 2.0, float("nan"), float("inf")]), ref, tol)
    assert nan_where_finite.n_bad == 1 and nan_where_finite.max_abs_err == float("inf")
    with pytest.raises(AssertionError, match="shape"):
        testing.compare(torch.zeros(3), torch.zeros(4, dtype=torch.float64), tol)


@pytest.mark.parametrize("rms_atol", [0.0, 1e-3])
def test_compare_in_chunks_gives_what_one_pass_gives(rms_atol, monkeypatch):
    """A GPU-sized output is compared a chunk at a time: the same counts, maxima and first bad element (in the
    output's own coordinates) as one pass, with chunks that do not divide the elements."""
    from tritonkit.registry import Tolerance

    ref = torch.randn(9, 13, dtype=torch.float64)
    out = ref.float() * (1 + 1e-7 * torch.randn(9, 13))
    out[2, 3], out[5, 0], out[8, 12] = out[2, 3] + 1.0, float("nan"), float("inf")
    tol = Tolerance(atol=1e-6, rtol=1e-5, rms_atol=rms_atol)
    whole = testing.compare(out, ref, tol)
    monkeypatch.setattr(testing, "COMPARE_CHUNK", 7)
    chunked = testing.compare(out, ref, tol)
    assert chunked == whole and whole.n_bad == 3 and whole.first_bad == (2, 3)


def test_compare_expects_infinity_where_the_exact_value_overflows_the_dtype():
    tol = registry.TOLERANCES[torch.float16]
    ref = torch.tensor([-262143.0, 70000.0, 65000.0], dtype=torch.float64)
    assert testing.compare(torch.tensor([float("-inf"), float("inf"), 65000.0], dtype=torch.float16), ref, tol).ok
    wrong_sign = torch.tensor([float("inf"), float("inf"), 65000.0], dtype=torch.float16)
    assert testing.compare(wrong_sign, ref, tol).n_bad == 1
    assert not testing.compare(torch.tensor([float("-inf")] * 3), ref, registry.TOLERANCES[torch.float32]).ok


def test_compare_rms_atol_scales_the_absolute_bound_by_the_reference_rms():
    from tritonkit.registry import Tolerance

    ref = torch.tensor([300.0, -400.0, 0.01, float("inf")], dtype=torch.float64)  # rms of the finite: ~288.7
    rms = float(ref[:3].square().mean().sqrt())
    tol = Tolerance(atol=0.0, rtol=0.0, rms_atol=1e-3)
    within = ref.clone()
    within[2] += 0.9e-3 * rms  # a cancelled element, off by less than 1e-3 of the rms
    assert testing.compare(within, ref, tol).ok
    beyond = ref.clone()
    beyond[2] += 1.1e-3 * rms
    result = testing.compare(beyond, ref, tol)
    assert result.n_bad == 1 and result.first_bad == (2,)
    assert not testing.compare(beyond, ref, Tolerance(atol=0.0, rtol=0.0)).ok  # the default adds nothing


def test_upcast_reaches_into_containers():
    half = torch.ones(2, dtype=torch.bfloat16)
    ints = torch.ones(2, dtype=torch.int32)
    upcast = testing.upcast({"bias": half, "pair": (half, ints), "eps": 1e-5})
    assert upcast["bias"].dtype == torch.float64 and upcast["pair"][0].dtype == torch.float64
    assert upcast["pair"][1] is ints and upcast["eps"] == 1e-5


# Allocations as a tritonkit op module makes them: poisoning looks at the calling module's name.
_OP_MODULE = {"__name__": "tritonkit.ops.probe", "torch": torch}
exec(
    "def allocate(dtype):\n"
    "    like = torch.ones(2)\n"
    "    return (torch.empty(4, dtype=dtype), torch.empty_like(like, dtype=dtype), like.new_empty((3,), dtype=dtype),\n"
    "            torch.empty_strided((2,), (1,), dtype=dtype))\n",
    _OP_MODULE,
)


@pytest.mark.parametrize(("dtype", "poison"), [(torch.bfloat16, None), (torch.uint8, 255), (torch.bool, True)])
def test_every_test_poisons_what_tritonkit_allocates(dtype, poison):
    """The suite's autouse fixture is on here: each allocator fills what tritonkit's ops allocate (NaN, the largest
    integer, True), and a nested poisoned_allocations() leaves it on when it ends."""
    with testing.poisoned_allocations():
        pass
    for out in _OP_MODULE["allocate"](dtype):
        assert (out.isnan() if poison is None else out == poison).all(), out


def test_poisoning_patches_torch_only_inside_its_context():
    """Outside any context (a fresh process: this suite's fixture holds one) torch's allocators are torch's own;
    inside, patched; after the outermost context, restored."""
    script = (
        "import torch\n"
        "from tritonkit.testing import poisoned_allocations\n"
        "original = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)\n"
        "with poisoned_allocations():\n"
        "    with poisoned_allocations():\n"
        "        pass\n"
        "    inside = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)\n"
        "after = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)\n"
        "print(all(a is not b for a, b in zip(inside, original)), all(a is b for a, b in zip(after, original)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["True", "True"], result.stdout + result.stderr


def test_spec_tolerance_for_reads_the_case():
    assert catalog.get("matmul").tolerance_for({"m": 1, "n": 1, "k": 400}, torch.float32).atol == (pytest.approx(2e-4))


def test_same_seed_gives_same_inputs_and_result():
    spec = catalog.get("add_relu")
    first = testing.run_case(spec, {"n": 123}, torch.float16, "cpu", seed=1234)
    second = testing.run_case(spec, {"n": 123}, torch.float16, "cpu", seed=1234)
    assert first.seed == second.seed == 1234 and first.comparisons == second.comparisons


def test_pipeline_depth_keeps_loop_buffers_within_the_device_shared_memory(monkeypatch):
    from tritonkit._core import device

    monkeypatch.setattr(device, "max_shared_memory", lambda _: 100 * 1024)  # a 100 KB GPU
    cuda = torch.device("cuda", 0)
    budget = 100 * 1024 - device._SHARED_MEMORY_RESERVE
    assert device.pipeline_depth(3, budget // 2, cuda) == 3  # two buffered iterations fit exactly
    assert device.pipeline_depth(3, budget // 2 + 1, cuda) == 2
    assert device.pipeline_depth(3, budget + 1, cuda) == 1  # not even one buffer: no pipelining
    assert device.pipeline_depth(1, 10 * budget, cuda) == 1
