import pytest
import torch

from tritonkit import registry
from tritonkit.registry import Inputs, KernelSpec


def test_every_spec_is_complete():
    specs = registry.all_specs()
    assert len(specs) >= 8
    problems = {spec.name: spec.missing() for spec in specs if spec.missing()}
    assert problems == {}


def test_public_ops_are_all_registered():
    import tritonkit.ops as ops

    registered = {spec.fn for spec in registry.all_specs()}
    registered |= {getattr(fn, "func", None) for fn in registered}  # functools.partial variants
    for name in ops.__all__:
        assert getattr(ops, name) in registered, f"public op {name} has no registry spec"


def _spec(name="tmp_spec", **changes):
    fields = dict(
        name=name,
        family="test",
        summary="s",
        fn=lambda x: x,
        reference=lambda x: x,
        make_inputs=lambda case, device, dtype, gen: Inputs((torch.zeros(1),)),
        test_cases=({"n": 1},),
        gpu_cases=({"n": 2},),
        bench_cases=({"n": 3},),
        bytes_moved=lambda case, dtype: 0,
        flops=lambda case, dtype: 0,
        dtypes=(torch.float32,),
        usage="x",
    )
    fields.update(changes)
    return KernelSpec(**fields)


def test_missing_reports_each_gap():
    spec = _spec(reference=None, test_cases=(), bench_cases=(), flops=None, usage="")
    assert spec.missing() == [
        "no reference",
        "no test cases",
        "no benchmark cases",
        "no cost model",
        "no usage example",
    ]
    assert _spec().missing() == []


def test_register_rejects_duplicates_and_bad_status():
    with pytest.raises(ValueError, match="'copy' is already registered"):
        registry.register(_spec(name="copy"))
    with pytest.raises(ValueError, match="'calibrate' is reserved"):
        registry.register(_spec(name="calibrate"))
    with pytest.raises(ValueError, match="status must be one of"):
        registry.register(_spec(name="never_registered", status="beta"))


def test_lookup_and_selection():
    assert registry.get("matmul_grouped").family == "matmul"
    with pytest.raises(KeyError, match="no kernel named 'nope'; registered: add, add_relu"):
        registry.get("nope")
    assert [s.name for s in registry.select(tag="matmul")] == [
        "matmul",
        "matmul_autotuned",
        "matmul_grouped",
        "matmul_naive",
    ]
    assert [s.name for s in registry.select(["copy", "add"], tag="elementwise")] == ["copy", "add"]
    assert registry.get("copy").case_id({"n": 7, "block_size": 4}) == "n7-block_size4"


def test_cost_models_are_exact():
    add = registry.get("add")
    assert add.bytes_moved({"n": 1000}, torch.bfloat16) == 6000
    assert add.flops({"n": 1000}, torch.float32) == 1000
    mm = registry.get("matmul")
    assert mm.bytes_moved({"m": 2, "n": 3, "k": 4}, torch.float16) == (8 + 12 + 6) * 2
    assert mm.flops({"m": 2, "n": 3, "k": 4}, torch.float16) == 48
    grey = registry.get("rgb_to_grey")
    assert grey.bytes_moved({"h": 10, "w": 20}, torch.uint8) == 800
