"""Write an entry as a TOML file (for ``tritonkit index add``): fields in schema order, multi-line text as
literal strings, and the result parsed back to make sure it says what was meant."""

from __future__ import annotations

import json
from pathlib import Path

from tritonkit.index.catalog import tomllib
from tritonkit.index.schema import ENTRY_FIELDS


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, str):
        if "\n" in value and "'''" not in value:
            # TOML drops the newline right after the opening quotes, so the text reads back unchanged.
            return "'''\n" + value + "'''"
        # A JSON string is a valid TOML basic string (same escapes) when non-ASCII is left as it is.
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def to_toml(data: dict) -> str:
    """TOML text for an entry's data: fields in schema order (any others after them), then the [verify] table."""
    order = [key for key in ENTRY_FIELDS if key in data] + [key for key in data if key not in ENTRY_FIELDS]
    lines = [f"{key} = {_toml_value(data[key])}" for key in order if key != "verify"]
    if "verify" in data:
        lines += ["", "[verify]"] + [f"{key} = {_toml_value(value)}" for key, value in data["verify"].items()]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != data:
        raise ValueError("the TOML written does not read back as the same entry")
    return text


def write_entry(data: dict, directory: Path) -> Path:
    """Write ``<directory>/<name>.toml``; refuses to overwrite."""
    path = Path(directory) / f"{data['name']}.toml"
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    path.write_text(to_toml(data), encoding="utf-8")
    return path
