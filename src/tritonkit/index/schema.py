"""The schema of a catalog entry and of a wanted kernel, and the validation that names every problem.

An external entry is one TOML file in ``entries/``; a wanted kernel is one table in ``wanted.toml``. Validation
never stops at the first problem: it returns one :class:`Problem` per bad field, each naming the file and the
field, so that a contributor fixes them all in one pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The tag vocabulary: a tag outside it is a typo until someone adds it here with a meaning.
TAGS: dict[str, str] = {
    "2d-grid": "launches a two-dimensional grid of programs",
    "compute-bound": "limited by arithmetic throughput (reported in TFLOP/s)",
    "image": "image processing",
    "memory-bound": "limited by memory bandwidth (reported in GB/s)",
    "activation": "pointwise activation functions (GELU, SiLU, ...)",
    "attention": "scaled dot-product attention, forward or backward",
    "backward": "has a hand-written backward (gradient) kernel",
    "cross-entropy": "cross-entropy and related losses over a vocabulary",
    "decoding": "single-token (or few-token) inference steps",
    "dropout": "dropout and random masks",
    "elementwise": "one output element per input element",
    "fp4": "4-bit floating point inputs (mxfp4, nvfp4)",
    "fp8": "8-bit floating point inputs or outputs",
    "fused": "fuses several operations into one pass over memory",
    "gated": "gated MLP activations (SwiGLU, GeGLU)",
    "grouped-gemm": "many independent GEMMs in one launch",
    "int4": "4-bit integer weights or activations",
    "int8": "8-bit integer weights or activations",
    "inference": "built for serving (no backward)",
    "kv-cache": "reads or writes a KV cache",
    "linear-attention": "linear attention and its gated or delta-rule variants",
    "lora": "low-rank adapters",
    "loss": "training losses (distillation, preference, ...)",
    "matmul": "matrix multiplication",
    "moe": "mixture of experts routing or GEMMs",
    "norm": "normalisation layers (LayerNorm, RMSNorm, ...)",
    "optimizer": "optimizer update steps",
    "paged": "paged (block-table) KV memory",
    "persistent": "persistent kernels (one program per SM looping over tiles)",
    "quantization": "quantize, dequantize or compute on quantized data",
    "rope": "rotary position embeddings",
    "softmax": "softmax and log-softmax",
    "state-space": "state-space models (Mamba, SSD)",
    "training": "built for training (forward and backward)",
    "tutorial": "written to teach",
}

LICENSES = (
    "Apache-2.0",
    "MIT",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "AGPL-3.0",
    "LGPL-3.0",
    "GPL-3.0",
    "unknown",
)
DTYPES = ("float64", "float32", "float16", "bfloat16", "float8", "int8", "int4", "fp4", "uint8", "int32", "int64")
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
URL_PATTERN = re.compile(r"^https://[A-Za-z0-9.-]+\.[A-Za-z]{2,}(/[^\s]*)?$")
GITHUB_FILE = re.compile(r"^https://github\.com/[^/\s]+/[^/\s]+/blob/[^/\s]+/\S+$")
GITHUB_PERMALINK = re.compile(r"^https://github\.com/[^/\s]+/[^/\s]+/blob/[0-9a-f]{40}/\S+$")
VERIFY_DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one field of one file."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Verify:
    """How ``tritonkit index verify`` checks an entry: import ``module``, run the entry's usage (which must
    assign ``out``), then ``reference`` (which must assign ``ref``), and compare within ``atol``/``rtol``."""

    module: str
    reference: str
    device: str = "cuda"
    atol: float = 1e-2
    rtol: float = 1e-2


@dataclass(frozen=True)
class Entry:
    """One kernel (or family of kernels in one file) in the catalog, ours or external."""

    name: str
    link: str
    author: str
    license: str
    tags: tuple[str, ...]
    description: str
    usage: str
    triton: str
    backward: bool
    dtypes: tuple[str, ...] = ()
    notes: str = ""
    checked: str = ""
    package: str = ""
    source: str = "external"  # "external" or "tritonkit"
    verify: Verify | None = None
    path: str = ""  # the file it came from (empty for our registry entries)
    # Our kernels only: status, limits and what they measured (tritonkit.index.measured.KernelMeasurements).
    status: str = ""
    limits: str = ""
    measurement: Any = None

    @property
    def ours(self) -> bool:
        return self.source == "tritonkit"

    def summary(self) -> str:
        """The first sentence of the description (the list view's line)."""
        first = self.description.strip().split(". ")[0]
        return first if first.endswith(".") else first + "."


@dataclass(frozen=True)
class Wanted:
    """A kernel the community still needs, why, and the closest existing work."""

    name: str
    title: str
    why: str
    closest: tuple[dict, ...]
    tags: tuple[str, ...] = ()
    path: str = ""


# field name -> (required, the TOML value's Python type or types)
_ENTRY_FIELDS: dict[str, tuple[bool, type | tuple[type, ...]]] = {
    "name": (True, str),
    "link": (True, str),
    "author": (True, str),
    "license": (True, str),
    "tags": (True, list),
    "description": (True, str),
    "usage": (True, str),
    "triton": (True, str),
    "backward": (True, bool),
    "dtypes": (True, list),
    "checked": (True, str),
    "notes": (False, str),
    "package": (False, str),
    "verify": (False, dict),
}
_VERIFY_FIELDS: dict[str, tuple[bool, type | tuple[type, ...]]] = {
    "import": (True, str),
    "reference": (True, str),
    "device": (False, str),
    "atol": (False, (int, float)),
    "rtol": (False, (int, float)),
}
_WANTED_FIELDS: dict[str, tuple[bool, type | tuple[type, ...]]] = {
    "name": (True, str),
    "title": (True, str),
    "why": (True, str),
    "closest": (True, list),
    "tags": (False, list),
}
_CLOSEST_FIELDS: dict[str, tuple[bool, type | tuple[type, ...]]] = {"link": (True, str), "what": (True, str)}


def _check_fields(data: dict, spec: dict, file: str, prefix: str = "") -> list[Problem]:
    """Missing required fields, unknown fields, wrong types and empty strings."""
    problems = []
    for key, (required, kind) in spec.items():
        where = prefix + key
        if key not in data:
            if required:
                problems.append(Problem(file, where, "missing (required)"))
            continue
        value = data[key]
        # bool is a subclass of int: a number field must not accept true/false
        if not isinstance(value, kind) or (kind in ((int, float), int) and isinstance(value, bool)):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            expected = " or ".join(_TOML_TYPE_NAMES.get(k, k.__name__) for k in kinds)
            got = _TOML_TYPE_NAMES.get(type(value), type(value).__name__)
            problems.append(Problem(file, where, f"expected {expected}, got {got} {value!r}"))
        elif isinstance(value, str) and required and not value.strip():
            problems.append(Problem(file, where, "is empty"))
    for key in data:
        if key not in spec:
            known = ", ".join(spec)
            problems.append(Problem(file, prefix + key, f"unknown field (known: {known})"))
    return problems


_TOML_TYPE_NAMES = {str: "string", bool: "boolean", int: "integer", float: "float", list: "array", dict: "table"}


def _check_url(value: Any, file: str, where: str) -> list[Problem]:
    if isinstance(value, str) and not URL_PATTERN.match(value):
        return [Problem(file, where, f"not an https URL: {value!r}")]
    return []


def _check_tags(tags: Any, known: set[str], file: str) -> list[Problem]:
    if not isinstance(tags, list):
        return []
    problems = []
    if not tags:
        problems.append(Problem(file, "tags", "is empty (give at least one tag)"))
    for tag in tags:
        if tag not in known:
            problems.append(Problem(file, "tags", f"unknown tag {tag!r} (see `tritonkit index tags`)"))
    return problems


def _check_name(name: Any, file: str) -> list[Problem]:
    if isinstance(name, str) and name and not NAME_PATTERN.match(name):
        return [Problem(file, "name", f"{name!r} must be lowercase letters, digits, '.', '_' or '-'")]
    return []


def validate_entry(data: dict, file: str, known_tags: set[str]) -> list[Problem]:
    """Every problem of one external entry's data (a parsed TOML table)."""
    problems = _check_fields(data, _ENTRY_FIELDS, file)
    problems += _check_name(data.get("name"), file)
    link = data.get("link")
    problems += _check_url(link, file, "link")
    on_github = isinstance(link, str) and link.startswith("https://github.com/") and URL_PATTERN.match(link)
    if on_github and not GITHUB_FILE.match(link):
        problems.append(Problem(file, "link", f"a GitHub link must point to a file (/blob/<ref>/<path>): {link!r}"))
    problems += _check_tags(data.get("tags"), known_tags, file)
    license_ = data.get("license")
    if isinstance(license_, str) and license_ not in LICENSES:
        problems.append(Problem(file, "license", f"unknown licence {license_!r} (known: {', '.join(LICENSES)})"))
    dtypes = data.get("dtypes")
    if isinstance(dtypes, list):
        for dtype in dtypes:
            if dtype not in DTYPES:
                problems.append(Problem(file, "dtypes", f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})"))
    verify = data.get("verify")
    if isinstance(verify, dict):
        problems += _check_fields(verify, _VERIFY_FIELDS, file, prefix="verify.")
        device = verify.get("device", "cuda")
        if device not in VERIFY_DEVICES:
            problems.append(Problem(file, "verify.device", f"must be one of {VERIFY_DEVICES}, got {device!r}"))
        if isinstance(data.get("usage"), str) and not re.search(r"^\s*out\s*=", data["usage"], re.MULTILINE):
            problems.append(Problem(file, "usage", "an entry with a verify table must assign `out` in its usage"))
    return problems


def validate_wanted(data: dict, file: str, known_tags: set[str]) -> list[Problem]:
    """Every problem of one wanted kernel's table."""
    problems = _check_fields(data, _WANTED_FIELDS, file)
    problems += _check_name(data.get("name"), file)
    # Tags are optional for a wanted kernel, but those given must be known.
    problems += [p for p in _check_tags(data.get("tags"), known_tags, file) if "is empty" not in p.message]
    closest = data.get("closest")
    if isinstance(closest, list):
        if not closest:
            problems.append(Problem(file, "closest", "is empty (name at least one existing work)"))
        for i, item in enumerate(closest):
            where = f"closest[{i}]."
            if not isinstance(item, dict):
                problems.append(Problem(file, f"closest[{i}]", f"expected table, got {item!r}"))
                continue
            problems += _check_fields(item, _CLOSEST_FIELDS, file, prefix=where)
            problems += _check_url(item.get("link"), file, where + "link")
    return problems


def entry_from_data(data: dict, path: str) -> Entry:
    """An :class:`Entry` from validated data."""
    verify = None
    if "verify" in data:
        v = data["verify"]
        verify = Verify(
            module=v["import"],
            reference=v["reference"],
            device=v.get("device", "cuda"),
            atol=float(v.get("atol", 1e-2)),
            rtol=float(v.get("rtol", 1e-2)),
        )
    return Entry(
        name=data["name"],
        link=data["link"],
        author=data["author"],
        license=data["license"],
        tags=tuple(data["tags"]),
        description=" ".join(data["description"].split()),
        usage=data["usage"].strip("\n"),
        triton=data["triton"],
        backward=data["backward"],
        dtypes=tuple(data["dtypes"]),
        notes=data.get("notes", "").strip(),
        checked=data["checked"].strip(),
        package=data.get("package", ""),
        verify=verify,
        path=path,
    )


def wanted_from_data(data: dict, path: str) -> Wanted:
    return Wanted(
        name=data["name"],
        title=data["title"],
        why=data["why"].strip(),
        closest=tuple(data["closest"]),
        tags=tuple(data.get("tags", ())),
        path=path,
    )


ENTRY_FIELDS = tuple(_ENTRY_FIELDS)
