"""The registry and the catalog: complete specs, typed cases, lookups, cost models."""

from dataclasses import dataclass

import pytest
import torch

from tritonkit import catalog, registry
from tritonkit.registry import Case, Inputs, KernelSpec


@dataclass(frozen=True)
class _VectorCase(Case):
    n: int
    stride: int = 1


def test_every_spec_is_complete():
    specs = catalog.all_specs()
    assert len(specs) >= 8
    problems = {spec.name: spec.missing() for spec in specs if spec.missing()}
    assert problems == {}


def test_every_spec_names_the_axis_its_bench_cases_sweep():
    """Plots draw one line per provider along this axis, for each fixed setting of the other keys."""
    for spec in catalog.all_specs():
        values = {case[spec.sweep] for case in spec.bench_cases}
        assert len(values) >= 2, f"{spec.name}: sweep {spec.sweep!r} takes {values} over its bench cases"


def test_public_ops_are_all_registered():
    import tritonkit.ops as ops

    registered = {spec.fn for spec in catalog.all_specs()} | {op for spec in catalog.all_specs() for op in spec.covers}
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
        case_type=_VectorCase,
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
    assert catalog.get("matmul_grouped").family == "tutorial"
    with pytest.raises(KeyError, match="no kernel named 'nope'; registered: add, add_relu"):
        catalog.get("nope")
    assert [s.name for s in catalog.select(tag="matmul")] == [
        "matmul",
        "matmul_autotuned",
        "matmul_grouped",
        "matmul_naive",
        "matmul_persistent",
    ]
    assert [s.name for s in catalog.select(["copy", "add"], tag="elementwise")] == ["copy", "add"]
    assert catalog.get("copy").case_id({"n": 7, "block_size": 4}) == "n7-block_size4"


def test_cost_models_are_exact():
    add = catalog.get("add")
    assert add.bytes_moved(add.parse_case({"n": 1000}), torch.bfloat16) == 6000
    assert add.flops(add.parse_case({"n": 1000}), torch.float32) == 1000
    mm = catalog.get("matmul")
    mm_case = mm.parse_case({"m": 2, "n": 3, "k": 4})
    assert mm.bytes_moved(mm_case, torch.float16) == (8 + 12 + 6) * 2
    assert mm.flops(mm_case, torch.float16) == 48
    grey = catalog.get("rgb_to_grey")
    assert grey.bytes_moved(grey.parse_case({"h": 10, "w": 20}), torch.uint8) == 800


def test_registration_parses_every_case_and_names_a_misspelt_key():
    spec = _spec()
    assert all(isinstance(case, _VectorCase) for case in (*spec.test_cases, *spec.gpu_cases, *spec.bench_cases))
    with pytest.raises(ValueError, match=r"tmp_spec: unknown case key\(s\) 'strde' for _VectorCase; its keys are n, "
                                         r"stride"):  # fmt: skip
        _spec(test_cases=({"n": 1, "strde": 2},))
    with pytest.raises(ValueError, match=r"tmp_spec: _VectorCase needs 'n'"):
        _spec(bench_cases=({"stride": 2},))
    with pytest.raises(ValueError, match=r"case key 'n' of _VectorCase must be int, got 1.5"):
        _spec(gpu_cases=({"n": 1.5},))
    with pytest.raises(ValueError, match=r"case key 'stride' of _VectorCase must be int, got True"):
        _spec(gpu_cases=({"n": 1, "stride": True},))


def test_every_family_rejects_a_misspelt_key():
    """The issue's example: a norm case with "resdual" fails where it is made, instead of silently testing without
    the residual."""
    for spec in catalog.all_specs():
        with pytest.raises(ValueError, match=f"{spec.name}: unknown case key\\(s\\) 'resdual'"):
            spec.parse_case({**spec.test_cases[0], "resdual": True})


def test_a_case_is_a_mapping_of_the_keys_it_was_given():
    case = _VectorCase.parse({"stride": 1, "n": 4})
    assert dict(case) == {"stride": 1, "n": 4} and case.n == 4 and case["stride"] == 1
    assert list(_VectorCase(n=4)) == ["n"]  # made directly: the fields that differ from their defaults
    assert _VectorCase.parse({"n": 4}) == _VectorCase(n=4)  # equality is the fields'
    with pytest.raises(KeyError):
        case["m"]
