"""The index: schema validation names file and field, search order, CLI commands, renderers, verify, our
kernels from the registry with their benchmarks, and the shipped catalog."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib

from tritonkit import catalog as kernel_catalog
from tritonkit.cli import main
from tritonkit.index import catalog as catalog_module
from tritonkit.index import measured, render, verify
from tritonkit.index.schema import GITHUB_PERMALINK, Entry
from tritonkit.index.search import (
    EXACT_NAME,
    NAME_CONTAINS_QUERY,
    NAME_CONTAINS_WORD,
    TAG,
    TEXT_WORD,
    WEIGHTS,
    ranking_record,
    score,
    search,
)
from tritonkit.index.writer import to_toml

REPO = Path(__file__).resolve().parents[1]
LINK = "https://github.com/owner/repo/blob/0123456789abcdef0123456789abcdef01234567/pkg/kernel.py"


def entry_data(entry_name: str, /, **changes) -> dict:
    data = {
        "name": entry_name,
        "link": LINK,
        "author": "A. Author",
        "license": "MIT",
        "tags": ["norm"],
        "description": "A kernel that normalises rows.",
        "usage": "out = kernel(x)",
        "triton": ">=3.0",
        "backward": False,
        "dtypes": ["float16"],
        "checked": "2026-11-22: read the file",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def write(directory: Path, data: dict, filename: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (filename or f"{data['name']}.toml")
    path.write_text(to_toml(data))
    return path


@pytest.fixture
def wanted_file(tmp_path) -> Path:
    path = tmp_path / "wanted.toml"
    path.write_text(
        '[[wanted]]\nname = "wanted-x"\ntitle = "X"\nwhy = "Because."\ntags = ["norm"]\n'
        'closest = [{ link = "https://example.org/x.py", what = "x" }]\n'
    )
    return path


def load_external(directory: Path, wanted: Path | None = None) -> catalog_module.Catalog:
    return catalog_module.load(directory, wanted or directory / "none.toml", results_dir=None, include_ours=False)


# ------------------------------------------------------------------ the shipped catalog


def test_shipped_catalog_is_valid_and_complete():
    catalog = catalog_module.load()
    assert catalog.problems == ()
    external = [e for e in catalog.entries if not e.ours]
    assert len(external) >= 30
    assert len(catalog.wanted) >= 6
    for entry in external:
        assert GITHUB_PERMALINK.match(entry.link), entry.name  # pinned to a commit, not a moving branch
        assert entry.checked.startswith("2026-"), entry.name
    names = {e.name for e in external}
    # the must-haves are all there
    for name in ("mamba-layer-norm", "xformers-flash-decoding-splitk", "flash-attn-triton", "unsloth-lora-mlp",
                 "triton-tutorial-block-scaled-matmul", "gptq-triton-matmul4", "bitsandbytes-triton-4bit"):  # fmt: skip
        assert name in names


def test_every_shipped_file_is_package_data():
    """The wheel ships exactly what pyproject's package-data globs match: every data file must match one."""
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "tritonkit.index"
    ]
    package = REPO / "src" / "tritonkit" / "index"
    data_files = [p for p in package.rglob("*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
    assert len(data_files) >= 33
    for path in data_files:
        relative = path.relative_to(package)
        assert any(relative.match(glob) for glob in globs), relative


# ------------------------------------------------------------------ validation


MUTATIONS = {
    "missing field": (dict(author=None), "author", "missing"),
    "bad url": (dict(link="ftp://example.org/x.py"), "link", "not an https URL"),
    "github link to a repository, not a file": (dict(link="https://github.com/owner/repo"), "link", "point to a file"),
    "unknown tag": (dict(tags=["norm", "nrom"]), "tags", "unknown tag 'nrom'"),
    "empty tags": (dict(tags=[]), "tags", "is empty"),
    "wrong type": (dict(backward="yes"), "backward", "expected boolean, got string"),
    "unknown field": (dict(licence="MIT"), "licence", "unknown field"),
    "unknown licence": (dict(license="Beerware"), "license", "unknown licence"),
    "unknown dtype": (dict(dtypes=["float17"]), "dtypes", "unknown dtype"),
    "bad name": (dict(name="Has Spaces"), "name", "must be lowercase"),
    "verify without reference": (dict(verify={"import": "torch"}), "verify.reference", "missing"),
    "verify with a bad device": (
        dict(verify={"import": "torch", "reference": "ref = 1", "device": "tpu"}),
        "verify.device",
        "must be one of",
    ),
}


@pytest.mark.parametrize("case", list(MUTATIONS), ids=list(MUTATIONS))
def test_validation_names_file_and_field(tmp_path, case):
    changes, field, message = MUTATIONS[case]
    path = write(tmp_path / "entries", entry_data("good"), "good.toml")
    write(tmp_path / "entries", entry_data("bad", **changes), "bad.toml")
    problems = load_external(tmp_path / "entries").problems
    assert len(problems) == 1, problems
    assert problems[0].file == str(tmp_path / "entries" / "bad.toml")
    assert problems[0].field == field
    assert message in problems[0].message
    assert str(path) not in str(problems)


def test_validation_reports_every_problem_of_a_file(tmp_path):
    write(tmp_path / "e", entry_data("bad", author=None, tags=["nope"], link="http://x"), "bad.toml")
    fields = sorted(p.field for p in load_external(tmp_path / "e").problems)
    assert fields == ["author", "link", "tags"]


def test_duplicate_names_are_reported_with_both_files(tmp_path):
    first = write(tmp_path / "e", entry_data("same"), "a.toml")
    second = write(tmp_path / "e", entry_data("same"), "b.toml")
    (problem,) = load_external(tmp_path / "e").problems
    assert (problem.file, problem.field) == (str(second), "name")
    assert "duplicate name 'same'" in problem.message and str(first) in problem.message


def test_an_external_entry_cannot_take_one_of_our_names(tmp_path, wanted_file):
    path = write(tmp_path / "e", entry_data("rms_norm"))
    catalog = catalog_module.load(tmp_path / "e", wanted_file, results_dir=None)
    assert [(p.file, p.field) for p in catalog.problems] == [(str(path), "name")]


def test_invalid_toml_is_a_problem_of_the_file(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "broken.toml").write_text('name = "x\n')
    (problem,) = load_external(tmp_path / "e").problems
    assert problem.field == "(file)" and "not valid TOML" in problem.message


def test_wanted_validation_names_the_table_and_field(tmp_path):
    path = tmp_path / "wanted.toml"
    path.write_text('[[wanted]]\nname = "w"\ntitle = "T"\nwhy = "Y"\nclosest = [{ link = "nope", what = "x" }]\n')
    (problem,) = load_external(tmp_path / "e", path).problems
    assert problem.file == f"{path}[wanted 0]" and problem.field == "closest[0].link"


def test_cli_validate_exit_codes(tmp_path, wanted_file, capsys):
    write(tmp_path / "e", entry_data("fine"))
    assert main(["index", "--entries", str(tmp_path / "e"), "--wanted", str(wanted_file), "validate"]) == 0
    assert "valid:" in capsys.readouterr().out
    write(tmp_path / "e", entry_data("broken", tags=["nope"]))
    assert main(["index", "--entries", str(tmp_path / "e"), "--wanted", str(wanted_file), "validate"]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'e' / 'broken.toml'}: tags: unknown tag 'nope'" in out


# ------------------------------------------------------------------ search


def fake(name, tags=("norm",), description="Something else.") -> Entry:
    return Entry(name=name, link=LINK, author="x", license="MIT", tags=tuple(tags), description=description,
                 usage="", triton="", backward=False)  # fmt: skip


SEARCH_POOL = [
    fake("attention-kernel", tags=("attention",)),
    fake("liger-rope", tags=("rope", "training")),
    fake("rms", tags=("norm",), description="Normalises rows; pairs well with rope."),
    fake("rope", tags=("rope",)),
    fake("rope-quant", tags=("quantization",)),
]


def test_search_ranks_exact_name_then_name_then_tag_then_description():
    hits = search(SEARCH_POOL, "rope")
    assert [e.name for _, e in hits] == ["rope", "liger-rope", "rope-quant", "rms"]
    assert [s for s, _ in hits] == [
        EXACT_NAME + TAG + NAME_CONTAINS_WORD,
        NAME_CONTAINS_QUERY + TAG + NAME_CONTAINS_WORD,
        NAME_CONTAINS_QUERY + NAME_CONTAINS_WORD,
        TEXT_WORD,
    ]


def test_search_needs_every_word_and_honours_the_tag_filter():
    assert [e.name for _, e in search(SEARCH_POOL, "rope training")] == ["liger-rope"]
    assert [e.name for _, e in search(SEARCH_POOL, "rope", tag="norm")] == ["rms"]
    assert search(SEARCH_POOL, "nothing-like-this") == []
    assert score(fake("x", description="Flash-decoding split."), "decoding") == TEXT_WORD  # parts of joined words


def test_cli_search_on_the_shipped_catalog(capsys):
    assert main(["index", "search", "rope"]) == 0
    names = [line.split()[1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert names[:4] == ["rope", "liger-rope", "unsloth-rope", "lightllm-rotary-emb"]  # exact name first
    assert main(["index", "search", "decoding", "--tag", "int4"]) == 0
    names = [line.split()[1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert names == ["xformers-flash-decoding-splitk"]
    assert main(["index", "search", "zzzz-no-such-thing"]) == 1


# ------------------------------------------------------------------ show, tags, wanted


def test_cli_show_external_and_ours(tmp_path, capsys):
    assert main(["index", "show", "xformers-flash-decoding-splitk"]) == 0
    out = capsys.readouterr().out
    assert "licence:      BSD-3-Clause" in out and "triton_splitk.FwOp" in out and "usage:" in out
    assert main(["index", "show", "rms_norm"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"measured:\s+fwd \d", out) and "backward:     yes" in out and "limits:" in out
    assert re.search(r"\n    fwd +rows16384-n16384-biasFalse +bfloat16 +\d", out)  # the table, a row per mode
    assert re.search(r"\n    fwd\+bwd +rows", out) and "liger-kernel ms" in out
    # a results folder with nothing in it: the kernel says so instead of failing
    assert main(["index", "--results", str(tmp_path / "none"), "show", "rms_norm"]) == 0
    assert f"measured:     {measured.NO_MEASUREMENT}" in capsys.readouterr().out
    assert main(["index", "show", "no-such-entry"]) == 2


def test_cli_tags_and_wanted(capsys):
    assert main(["index", "tags"]) == 0
    rows = {line.split()[0]: int(line.split()[1]) for line in capsys.readouterr().out.splitlines()[2:]}
    catalog = catalog_module.load()
    assert rows["attention"] == sum("attention" in e.tags for e in catalog.entries) >= 5
    assert main(["index", "wanted"]) == 0
    out = capsys.readouterr().out
    assert f"{len(catalog.wanted)} kernels wanted" in out and "closest:" in out and "why:" in out


# ------------------------------------------------------------------ add


ADD_FLAGS = ["--name", "new-kernel", "--link", LINK, "--author", "Me", "--license", "MIT", "--tag", "norm",
             "--tag", "fused", "--description", "Fuses things.", "--usage", "out = f(x)", "--triton", ">=3.0",
             "--dtype", "bfloat16", "--checked", "2026-11-22: read it", "--no-backward"]  # fmt: skip


def test_add_writes_a_valid_entry_and_refuses_duplicates(tmp_path, wanted_file, capsys):
    entries = tmp_path / "entries"
    entries.mkdir()
    base = ["index", "--entries", str(entries), "--wanted", str(wanted_file)]
    assert main([*base, "add", *ADD_FLAGS]) == 0
    catalog = load_external(entries)
    assert catalog.problems == ()
    (entry,) = catalog.entries
    assert (entry.name, entry.tags, entry.backward, entry.dtypes) == (
        "new-kernel",
        ("norm", "fused"),
        False,
        ("bfloat16",),
    )
    capsys.readouterr()
    assert main([*base, "add", *ADD_FLAGS]) == 1
    assert "already exists" in capsys.readouterr().err
    renamed = [*ADD_FLAGS]
    renamed[1] = "rms_norm"  # one of our kernels
    assert main([*base, "add", *renamed]) == 1


def test_add_without_a_terminal_names_the_missing_flags(tmp_path, wanted_file, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    entries = tmp_path / "entries"
    entries.mkdir()
    assert main(["index", "--entries", str(entries), "--wanted", str(wanted_file), "add", "--name", "x"]) == 1
    err = capsys.readouterr().err
    assert "link: missing (required) (flag --link)" in err and "(flag --tag)" in err
    assert list(entries.glob("*.toml")) == []


def test_add_prompts_for_what_is_missing_on_a_terminal(tmp_path, wanted_file, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    answers = iter(["prompted", LINK, "Me", "Apache-2.0", "norm, fused", "Does it.", "out = g(x)", "unknown",
                    "float16, float32", "2026-11-22: read it", "y"])  # fmt: skip
    monkeypatch.setattr("builtins.input", lambda _prompt: next(answers))
    entries = tmp_path / "entries"
    entries.mkdir()
    assert main(["index", "--entries", str(entries), "--wanted", str(wanted_file), "add"]) == 0
    (entry,) = load_external(entries).entries
    assert (entry.name, entry.tags, entry.dtypes, entry.backward) == (
        "prompted",
        ("norm", "fused"),
        ("float16", "float32"),
        True,
    )


# ------------------------------------------------------------------ render


def test_render_markdown_lists_everything_grouped_by_tag():
    catalog = catalog_module.load()
    text = render.render_markdown(catalog, our_prefix="../")
    # our kernels' compact table: a row per measured mode, tritonkit against the three baselines
    assert (
        "| kernel | mode | case | dtype | tritonkit ms | torch eager ms | torch.compile ms | liger-kernel ms |" in text
    )
    for mode in ("fwd", "bwd", "fwd+bwd"):
        assert re.search(rf"\| rms_norm \| {re.escape(mode)} \| rows\d+-n\d+-biasFalse \| bfloat16 \| [\d.]+ \|", text)
    flce_row = r"\| fused_linear_cross_entropy \| fwd\+bwd \| tokens\d+-hidden\d+-vocab\d+ \| bfloat16 \| [\d.]+ \|"
    assert re.search(flce_row, text)
    # a run without a cost model renders "-" (test_modes_plots_and_a_missing_cost_model), never 0 TFLOP/s
    assert not re.search(r"[ |]0 TFLOP/s|\(0%", text)
    for entry in catalog.entries:
        assert f"| [{entry.name}](" in text  # the overview table has every entry
    assert "### attention" in text and "## Wanted" in text
    assert "[rms_norm](../src/tritonkit/ops/norm/op.py)" in text
    for wanted in catalog.wanted:
        assert f"**{wanted.name}**" in text


def test_committed_markdown_is_up_to_date(tmp_path):
    out = REPO / "docs" / "index.md"
    fresh = tmp_path / "index.md"
    assert main(["index", "render", "--format", "md", "--out", str(fresh)]) == 0
    # rendered elsewhere, the repository links differ: compare with links made relative to docs/
    expected = render.render_markdown(catalog_module.load(), our_prefix="../")
    assert out.read_text() == expected, (
        "docs/index.md is stale: run `tritonkit index render --format md --out docs/index.md`"
    )


def test_render_html_writes_a_page_per_entry_and_copies_plots(tmp_path):
    catalog = catalog_module.load()
    written = render.render_html(catalog, tmp_path)
    assert {p.name for p in written} >= {"index.html", "wanted.html", "app.js", "style.css"}
    index = (tmp_path / "index.html").read_text()
    data = json.loads(re.search(r'id="catalog-data">(.*?)</script>', index, re.S).group(1))
    assert data["weights"] == WEIGHTS  # the site ranks with the CLI's weights and records
    assert data["entries"] == [ranking_record(e) for e in catalog.entries]
    for entry in catalog.entries:
        if entry.ours and entry.measurement:
            page = (tmp_path / "entries" / f"{entry.name}.html").read_text()
            assert '<pre><code id="usage">' in page and '<table id="measured"' in page
            modes = re.findall(r'<tr data-mode="([^"]+)">', page)
            assert modes == [row.mode for row in entry.measurement.rows] and 1 <= len(modes) <= 3
            plots = re.findall(r'src="\.\./plots/([^"]+)"', page)
            assert len(plots) <= measured.MAX_PLOTS
            assert all((tmp_path / "plots" / name).stat().st_size > 0 for name in plots)
    rms = (tmp_path / "entries" / "rms_norm.html").read_text()
    assert len(re.findall(r'src="\.\./plots/', rms)) == 3  # fwd, bwd and fwd+bwd: one plot each, not 59
    assert "http" not in (tmp_path / "app.js").read_text()  # nothing fetched from the network


def test_render_refuses_an_invalid_catalog(tmp_path, wanted_file, capsys):
    write(tmp_path / "e", entry_data("broken", tags=["nope"]))
    args = ["index", "--entries", str(tmp_path / "e"), "--wanted", str(wanted_file), "render", "--format", "md"]
    assert main(args) == 1
    assert "not valid" in capsys.readouterr().err


# ------------------------------------------------------------------ verify


def verified(tmp_path, name, usage, reference, module="torch", device="cpu"):
    data = entry_data(name, usage=usage, verify={"import": module, "reference": reference, "device": device,
                                                 "atol": 1e-6, "rtol": 0.0})  # fmt: skip
    write(tmp_path, data)
    return data


def test_verify_pass_fail_and_skip(tmp_path, capsys):
    wanted_file = tmp_path / "no-wanted.toml"
    verified(
        tmp_path, "torch-only", "import torch\nout = torch.arange(5.0) * 2", "ref = torch.tensor([0., 2, 4, 6, 8])"
    )
    verified(tmp_path, "wrong", "import torch\nout = torch.arange(5.0)", "ref = torch.arange(5.0) + 1e-3")
    verified(tmp_path, "crashes", "out = undefined_name", "ref = 0")
    verified(tmp_path, "missing-package", "out = 1", "ref = 1", module="no_such_package_xyz.ops")
    verified(tmp_path, "needs-gpu", "out = 1", "ref = 1", device="cuda")
    write(tmp_path, entry_data("no-check"))
    results = {r.name: r for r in verify.verify(load_external(tmp_path).entries)}
    assert results["torch-only"].status == verify.PASS and "max abs error 0.000e+00" in results["torch-only"].reason
    assert results["wrong"].status == verify.FAIL and "1.000e-03" in results["wrong"].reason
    assert results["crashes"].status == verify.FAIL and "NameError" in results["crashes"].reason
    assert results["missing-package"].status == verify.SKIPPED
    assert "'no_such_package_xyz' is not installed" in results["missing-package"].reason
    assert results["no-check"].status == verify.SKIPPED
    import torch

    if not torch.cuda.is_available():
        assert results["needs-gpu"].reason == "needs a CUDA GPU"
    base = ["index", "--entries", str(tmp_path), "--wanted", str(wanted_file), "verify"]
    assert main([*base, "torch-only"]) == 0
    assert main(base) == 1  # a failure anywhere is the command's failure
    assert "1 passed, 2 failed, 3 skipped" in capsys.readouterr().out


def test_verify_runs_over_the_shipped_catalog_without_crashing():
    results = verify.verify(catalog_module.load().entries)
    assert len(results) >= 30
    assert all(r.status in (verify.PASS, verify.FAIL, verify.SKIPPED) and r.reason for r in results)


# ------------------------------------------------------------------ our kernels


def test_every_registered_kernel_is_an_entry():
    index = catalog_module.load()
    for spec in kernel_catalog.all_specs():
        entry = index.get(spec.name)
        assert entry.ours and entry.usage.strip() == spec.usage.strip()
        assert entry.backward == spec.has_backward and entry.limits == spec.limits and entry.status == spec.status
        assert entry.dtypes == tuple(str(d).removeprefix("torch.") for d in spec.dtypes)
        assert spec.family in entry.tags
        assert (REPO / entry.link).is_file()


def _run(device_dir: Path, stem: str, date: str, rows: list[dict], **meta) -> None:
    device_dir.mkdir(parents=True, exist_ok=True)
    record = {"meta": {"device": "GPU X", "date": date, "sizes": "sweep", **meta}, "results": rows}
    (device_dir / f"{stem}.json").write_text(json.dumps(record))


def _row(case, dtype="bfloat16", mode="fwd", provider="tritonkit", ms=1.0, spec="add", **fields):
    """A timed row whose bytes grow with the case's size: 100 MB at 2^20 elements (the headline is the most work)."""
    megabytes = 100.0 * measured._elements(case) / 2**20
    row = {"spec": spec, "case": case, "case_id": "-".join(f"{k}{v}" for k, v in case.items()), "dtype": dtype,
           "mode": mode, "provider": provider, "ms": ms, "gbps": megabytes / ms, "tflops": None, "unit": "GB/s",
           "percent_of_ceiling": 50.0}  # fmt: skip
    return {**row, **fields}


def _peers(case, ms, **fields):
    """tritonkit and the three baselines on one case: ``ms`` in that order (None: not timed)."""
    names = ("tritonkit", "torch", "torch.compile", "liger")
    return [_row(case, provider=name, ms=t, **fields) for name, t in zip(names, ms, strict=True) if t is not None]


def _summary(results: Path, kernels=None) -> dict:
    return measured.summarize(results, kernels or {"add": "n", "rms_norm": "n"})


def test_the_latest_run_of_each_mode_with_its_baselines(tmp_path):
    device = tmp_path / "gpu-x"
    case = {"n": 2**20}
    _run(device, "2026-01-01-old", "2026-01-01", _peers({"n": 10**9}, (9.0, 9.5, 9.9, None)))
    _run(device, "2026-02-01-early", "2026-02-01", _peers(case, (3.0, 4.0, 5.0, None)),
         committed="2026-02-01T08:00:00+00:00")  # fmt: skip
    _run(device, "2026-02-01-late", "2026-02-01",
         _peers({"n": 1024}, (0.5, 0.6, 0.7, None)) + _peers(case, (2.0, 4.0, 3.0, None))
         + _peers(case, (3.0, 1.0, None, None), dtype="float32"), time="2026-02-01T17:00:00+00:00")  # fmt: skip
    _run(device, "2026-02-01-alone", "2026-02-01", [_row(case, ms=1.5)], time="2026-02-01T23:00:00+00:00")
    _run(device, "2026-02-01-picked", "2026-02-01", _peers(case, (1.0, 2.0, None, None)),
         time="2026-02-01T23:30:00+00:00", sizes="given cases")  # fmt: skip
    (row,) = _summary(tmp_path)["kernels"]["add"]
    m = measured.ModeRow(**row)
    # newest date; a run with baselines before one without; the spec's own cases before given ones; then later
    assert (m.source, m.mode, m.case_id, m.dtype, m.date) == ("gpu-x/2026-02-01-late.json", "fwd", "n1048576",
                                                              "bfloat16", "2026-02-01")  # fmt: skip
    assert m.ms == {"tritonkit": 2.0, "torch": 4.0, "torch.compile": 3.0, "liger": None}
    assert (m.best_baseline, m.speedup) == ("torch.compile", 1.5)
    assert m.cells() == ["fwd", "n1048576", "bfloat16", "2", "4", "3", "-", "1.50x torch.compile", "50 GB/s (50%)",
                         "eager", "GPU X", "2026-02-01"]  # fmt: skip
    assert m.plot is None  # no PNG in the folder


def test_other_peers_get_columns_of_their_own(tmp_path):
    """A kernel compared with other libraries (attention: SDPA, FlexAttention) shows them after the standard three
    columns, they count as baselines, and the catalog's markdown gives such kernels a table of their own."""
    device = tmp_path / "gpu-x"
    case = {"b": 4, "hq": 32, "hk": 32, "sq": 4096, "sk": 4096, "d": 128}
    attention = [_row(case, spec="attention", provider=name, ms=ms, mode=mode)
                 for mode in ("fwd", "fwd+bwd")
                 for name, ms in (("tritonkit", 1.0), ("sdpa-flash", 1.2), ("sdpa-cudnn", 0.9), ("flex", 1.6))
                 if (mode, name) != ("fwd+bwd", "sdpa-cudnn")]  # fmt: skip
    _run(device, "2026-02-01-attention", "2026-02-01", attention, cuda_graph=True)
    _run(device, "2026-02-01-add", "2026-02-01", _peers({"n": 2**20}, (2.0, 4.0, 3.0, None)))
    summary = measured.summarize(tmp_path, {"attention": "sq", "add": "n"})
    kernel = measured.for_kernel(summary, "attention", None)
    assert kernel.peers == ["sdpa-flash", "sdpa-cudnn", "flex"]
    headers = kernel.headers()
    assert headers[3:10] == ["tritonkit ms", "torch eager ms", "torch.compile ms", "liger-kernel ms", "SDPA flash ms",
                             "SDPA cuDNN ms", "FlexAttention ms"]  # fmt: skip
    fwd, both = kernel.table()
    assert len(fwd) == len(both) == len(headers)
    assert fwd[3:11] == ["1", "-", "-", "-", "1.2", "0.9", "1.6", "0.90x SDPA cuDNN"]
    assert both[3:11] == ["1", "-", "-", "-", "1.2", "-", "1.6", "1.20x SDPA flash"]  # cuDNN not timed there
    add = measured.for_kernel(summary, "add", None)
    assert add.peers == [] and add.headers() == measured.TABLE_HEADERS and len(add.table()[0]) == len(headers) - 3
    assert summary["kernels"]["add"][0]["ms"] == {"tritonkit": 2.0, "torch": 4.0, "torch.compile": 3.0, "liger": None}

    text = render.render_markdown(catalog_module.load(results_dir=tmp_path))
    standard, with_peers = ("| kernel | " + " | ".join(columns) + " |" for columns in (measured.TABLE_HEADERS, headers))
    assert text.count(standard) == 1 and text.count(with_peers) == 1
    assert text.index(standard) < text.index("| add | fwd |") < text.index(with_peers) < text.index("| attention |")
    assert re.search(r"\| attention \| fwd\+bwd \| b4-hq32.* \| 1 \| - \| - \| - \| 1\.2 \| - \| 1\.6 \| 1\.20x", text)


def test_a_run_without_baselines_still_counts_when_it_is_all_there_is(tmp_path):
    _run(tmp_path / "gpu-x", "2026-02-01-alone", "2026-02-01", [_row({"n": 4096}, ms=1.5)])
    kernel = measured.for_kernel(_summary(tmp_path), "add", None)
    (row,) = kernel.rows
    assert (row.speedup, row.cells()[4:8]) == (None, ["-", "-", "-", "-"])
    assert kernel.line() == "fwd 1.5 ms [GPU X, 2026-02-01]"  # no speed-up claimed


def test_modes_plots_and_a_missing_cost_model(tmp_path):
    device = tmp_path / "gpu-x"
    big = {"rows": 16384, "n": 4096, "bias": False}
    small = {"rows": 16384, "n": 1024, "bias": False}
    for mode in ("fwd", "bwd", "fwd+bwd", "fwd-train"):
        stem = f"2026-02-01-norm-{mode.replace('+', '-')}"
        rows = [*_peers(small, (1.0, 2.0, 1.5, 1.2), spec="rms_norm", mode=mode),
                *_peers(big, (2.0, 4.0, 3.0, 2.5), spec="rms_norm", mode=mode)]  # fmt: skip
        if mode == "bwd":  # written before the unit rule: a mode without a cost model said 0.0 TFLOP/s
            rows = [{**r, "unit": "TFLOP/s", "tflops": 0.0, "percent_of_ceiling": 0.0} for r in rows]
        _run(device, stem, "2026-02-01", rows, cuda_graph=True)
        (device / f"{stem}-rms_norm-bfloat16-{mode.replace('+', '-')}.png").write_bytes(b"png")
    (device / "2026-02-01-norm-fwd-add-bfloat16-fwd.png").write_bytes(b"png")  # another kernel's plot
    summary = _summary(tmp_path)
    rows = [measured.ModeRow(**row) for row in summary["kernels"]["rms_norm"]]
    assert [r.mode for r in rows] == ["fwd", "bwd", "fwd+bwd"]  # the training forward is not a row
    assert {r.case_id for r in rows} == {"rows16384-n4096-biasFalse"} and {r.speedup for r in rows} == {1.25}
    assert rows[1].rate is None and rows[1].cells()[8] == "-"  # no "0 TFLOP/s (0% of ceiling)"
    # a plot per mode from the run shown; none for the mode without a rate (nothing to put on y)
    assert [r.plot for r in rows] == ["gpu-x/2026-02-01-norm-fwd-rms_norm-bfloat16-fwd.png", None,
                                      "gpu-x/2026-02-01-norm-fwd-bwd-rms_norm-bfloat16-fwd-bwd.png"]  # fmt: skip
    kernel = measured.for_kernel(summary, "rms_norm", tmp_path)
    assert [p.name for p in kernel.plots] == [Path(r.plot).name for r in rows if r.plot]
    assert kernel.line() == ("fwd 2 ms, 1.25x; bwd 2 ms, 1.25x; fwd+bwd 2 ms, 1.25x against the best baseline "
                             "[GPU X, 2026-02-01]")  # fmt: skip
    assert measured.for_kernel(summary, "rms_norm", None).plots == ()  # an installed package: numbers, no plots
    assert measured.for_kernel(summary, "add", tmp_path) is None
    assert _summary(tmp_path / "nowhere") == {"results": "benchmarks/results", "kernels": {}}


def test_the_shipped_summary_is_up_to_date_with_the_results():
    specs = catalog_module.registry_specs()
    fresh = measured.summary_text(measured.summarize(REPO / "benchmarks" / "results", measured.axes_of(specs)))
    assert measured.SUMMARY_FILE.read_text() == fresh, (
        "src/tritonkit/index/measured.json is stale: run `tritonkit index measured`"
    )
    assert main(["index", "measured", "--check"]) == 0
    kernels = json.loads(fresh)["kernels"]
    assert {"rms_norm", "layer_norm", "softmax", "cross_entropy", "rope", "swiglu"} <= set(kernels)
    assert {row["mode"] for row in kernels["rms_norm"]} == {"fwd", "bwd", "fwd+bwd"}


def test_measured_command_writes_and_checks(tmp_path, capsys):
    out = tmp_path / "measured.json"
    assert main(["index", "measured", "--out", str(out), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert main(["index", "measured", "--out", str(out)]) == 0
    assert out.read_text() == measured.SUMMARY_FILE.read_text()
    assert main(["index", "--results", str(tmp_path / "none"), "measured", "--out", str(out)]) == 2


def test_without_a_results_folder_the_shipped_summary_is_read(monkeypatch, capsys):
    monkeypatch.setattr(measured, "default_results_dir", lambda: None)  # as in an installed wheel
    entry = catalog_module.load().get("rms_norm")
    assert [row.mode for row in entry.measurement.rows] == ["fwd", "bwd", "fwd+bwd"]
    assert entry.measurement.plots == ()
    shipped = measured.for_kernel(measured.shipped_summary(), "rms_norm", None)
    assert entry.measurement == shipped
    assert main(["index", "show", "rms_norm"]) == 0
    assert measured.NO_MEASUREMENT not in capsys.readouterr().out


def test_an_installed_wheel_ships_the_measured_numbers(tmp_path):
    """Build the wheel as pip would, unpack it away from the checkout, and read a kernel's measurements there."""
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp_path / "dist")], capture_output=True, text=True)  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("tritonkit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "tritonkit/index/measured.json" in archive.namelist()
        archive.extractall(tmp_path / "site")
    script = ("import tritonkit, json\n"
              "from tritonkit.index import catalog, measured\n"
              "line = catalog.load().get('rms_norm').measurement.line()\n"
              "print(json.dumps([tritonkit.__file__, str(measured.default_results_dir()), line]))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    where, results, line = json.loads(run.stdout.splitlines()[-1])
    assert where.startswith(str(tmp_path / "site")) and results == "None"
    assert line.startswith("fwd ") and "bwd" in line and "NVIDIA H200" in line


def test_the_headline_case_is_the_one_that_did_the_most_work(tmp_path):
    """One token appended to each of 256 sequences names a large cache (256 x 4096) but moves 2 MB; a prompt of 2048
    tokens for 8 sequences moves 133 MB: the prompt heads the row, as the work (rate x time) ranks cases."""
    device = tmp_path / "gpu-x"
    one_token = _row({"b": 256, "s": 4096, "sq": 1}, ms=0.002, gbps=1000.0)
    prompt = _row({"b": 8, "s": 0, "sq": 2048}, ms=0.035, gbps=3800.0)
    _run(device, "2026-02-01-append", "2026-02-01", [one_token, prompt])
    (row,) = _summary(tmp_path)["kernels"]["add"]
    assert measured.ModeRow(**row).case_id == "b8-s0-sq2048"
