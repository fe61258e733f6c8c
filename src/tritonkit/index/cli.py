"""``tritonkit index ...``: search, show, tags, wanted, validate, verify, add and render the catalog, and write the
measured summary that ships in the package (``measured``).

The main CLI adds this with :func:`add_parser`; every command reads the catalog through
:func:`tritonkit.index.catalog.load` (``--entries``, ``--wanted`` and ``--results`` point it elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

from tritonkit._core.text import format_fields, format_table
from tritonkit.index import catalog as catalog_module
from tritonkit.index import measured, render, search, verify, writer
from tritonkit.index.schema import LICENSES, TAGS, validate_entry

_SHOW_WIDTH = 88


def _load(args) -> catalog_module.Catalog:
    results = Path(args.results) if args.results else "default"
    return catalog_module.load(Path(args.entries), Path(args.wanted), results_dir=results)


def _cmd_search(args) -> int:
    catalog = _load(args)
    hits = search.search(catalog.entries, " ".join(args.text), tag=args.tag)
    if not hits:
        print("no entry matches", file=sys.stderr)
        return 1
    rows = []
    for score, e in hits:
        source = "tritonkit" if e.ours else "external"
        rows.append([str(score), e.name, source, ",".join(e.tags), textwrap.shorten(e.summary(), 80)])
    print(format_table(["score", "name", "source", "tags", "summary"], rows))
    return 0


def _cmd_show(args) -> int:
    catalog = _load(args)
    try:
        entry = catalog.get(args.name)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    fields = [
        ("name", entry.name),
        ("source", "tritonkit" if entry.ours else "external"),
        ("link", entry.link),
        ("author", entry.author),
        ("licence", entry.license),
        ("tags", ", ".join(entry.tags)),
        ("description", entry.description),
        ("dtypes", ", ".join(entry.dtypes) or "-"),
        ("backward", "yes" if entry.backward else "no"),
        ("triton", entry.triton),
    ]
    if entry.ours:
        fields += [("status", entry.status), ("limits", entry.limits or "-")]
        fields.append(("measured", entry.measurement.line() if entry.measurement else measured.NO_MEASUREMENT))
    fields += [("checked", entry.checked), ("notes", entry.notes or "-")]
    print(format_fields(fields, width=_SHOW_WIDTH))
    if entry.measurement:
        print("measured against the baselines (ms):")
        print(textwrap.indent(format_table(entry.measurement.headers(), entry.measurement.table()), "    "))
    print("usage:")
    print(textwrap.indent(entry.usage, "    "))
    return 0


def _cmd_tags(args) -> int:
    catalog = _load(args)
    rows = [[tag, str(count), TAGS.get(tag, "a family or tag of our kernels")] for tag, count in catalog.tags().items()]
    print(format_table(["tag", "entries", "meaning"], rows))
    return 0


def _cmd_wanted(args) -> int:
    catalog = _load(args)
    for wanted in catalog.wanted:
        print(f"{wanted.name}: {wanted.title}")
        print(textwrap.fill(wanted.why, width=_SHOW_WIDTH, initial_indent="  why: ", subsequent_indent="       "))
        for closest in wanted.closest:
            print(f"  closest: {closest['what']} <{closest['link']}>")
        print()
    print(f"{len(catalog.wanted)} kernels wanted")
    return 0


def _cmd_validate(args) -> int:
    catalog = _load(args)
    for problem in catalog.problems:
        print(problem)
    external = sum(not e.ours for e in catalog.entries)
    summary = (
        f"{len(catalog.entries) - external} tritonkit kernels, {external} external entries, "
        f"{len(catalog.wanted)} wanted"
    )
    if catalog.problems:
        print(f"{len(catalog.problems)} problems ({summary} valid)")
        return 1
    print(f"valid: {summary}")
    return 0


def _cmd_verify(args) -> int:
    catalog = _load(args)
    try:
        entries = [catalog.get(name) for name in args.names] if args.names else catalog.entries
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    results = verify.verify(entries)
    print(format_table(["entry", "result", "detail"], [[r.name, r.status, r.reason] for r in results]))
    counts = {status: sum(r.status == status for r in results) for status in (verify.PASS, verify.FAIL, verify.SKIPPED)}
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped")
    return 1 if counts["fail"] else 0


# Flags of `add`, in the order prompts ask for them: (field, prompt, is a list).
_ADD_FIELDS = (
    ("name", "name (lowercase, e.g. liger-rms-norm)", False),
    ("link", "link to the file (a commit-pinned GitHub permalink where possible)", False),
    ("author", "author(s)", False),
    ("license", f"licence ({', '.join(LICENSES)})", False),
    ("tags", "tags, comma-separated (see `tritonkit index tags`)", True),
    ("description", "description (operations, sizes, dtypes)", False),
    ("usage", "minimal usage (one line; edit the file for more)", False),
    ("triton", "Triton version range (or unknown)", False),
    ("dtypes", "dtypes, comma-separated", True),
    ("checked", "how and when you checked it against its source", False),
)


def _prompt(label: str) -> str:
    return input(f"{label}: ").strip()


def _cmd_add(args) -> int:
    data: dict = {}
    interactive = sys.stdin.isatty()
    for field, label, is_list in _ADD_FIELDS:
        value = getattr(args, field)
        if value is None and interactive:
            value = _prompt(label)
            value = [v.strip() for v in value.split(",") if v.strip()] if is_list else value
        if value is not None:
            data[field] = list(value) if is_list else value
    if args.backward is None and interactive:
        data["backward"] = _prompt("has a backward? (y/n)").lower().startswith("y")
    elif args.backward is not None:
        data["backward"] = args.backward
    if args.notes:
        data["notes"] = args.notes
    if args.package:
        data["package"] = args.package
    catalog = _load(args)
    problems = validate_entry(data, "(new entry)", catalog_module.known_tags())
    if data.get("name") in {e.name for e in catalog.entries} | {w.name for w in catalog.wanted}:
        print(f"an entry named {data['name']!r} already exists", file=sys.stderr)
        return 1
    if problems:
        for problem in problems:
            flag = "--" + problem.field.replace("tags", "tag").replace("dtypes", "dtype")
            print(f"{problem} (flag {flag})", file=sys.stderr)
        return 1
    path = writer.write_entry(data, Path(args.entries))
    print(f"wrote {path}")
    return 0


def _cmd_render(args) -> int:
    catalog = _load(args)
    if catalog.problems:
        for problem in catalog.problems:
            print(problem, file=sys.stderr)
        print("the catalog is not valid: fix it before rendering (`tritonkit index validate`)", file=sys.stderr)
        return 1
    if args.format == "html":
        if not args.out:
            print("--format html needs --out DIR", file=sys.stderr)
            return 2
        written = render.render_html(catalog, Path(args.out))
        print(f"wrote {len(written)} files into {args.out}; open {Path(args.out) / 'index.html'}")
        return 0
    prefix = ""
    results_dir = measured.default_results_dir()
    if args.out and results_dir is not None:
        # Our kernels' links are repository paths: make them relative to the file written.
        repo_root = results_dir.parents[1]
        prefix = os.path.relpath(repo_root, Path(args.out).resolve().parent).replace(os.sep, "/") + "/"
    text = render.render_markdown(catalog, our_prefix="" if prefix == "./" else prefix)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _cmd_measured(args) -> int:
    """Write (or with --check compare) the summary of benchmarks/results that ships in the package."""
    results = Path(args.results) if args.results else measured.default_results_dir()
    if results is None or not results.is_dir():
        print("no benchmarks/results here: run this in a source checkout, or pass --results DIR", file=sys.stderr)
        return 2
    specs = catalog_module.registry_specs()
    text = measured.summary_text(measured.summarize(results, measured.axes_of(specs)))
    out = Path(args.out)
    if args.check:
        if out.exists() and out.read_text() == text:
            print(f"{out} is up to date with {results}")
            return 0
        print(f"{out} is stale: run `tritonkit index measured`", file=sys.stderr)
        return 1
    out.write_text(text)
    kernels = len(json.loads(text)["kernels"])
    print(f"wrote {out}: {kernels} kernels measured, from {results}")
    return 0


def add_parser(sub) -> None:
    """Add ``index`` and its commands to the main CLI's subparsers."""
    index = sub.add_parser(
        "index",
        help="the catalog of Triton kernels: ours and the community's, and those still wanted",
        description="Search, show, validate, verify, add to and render the catalog of Triton kernels.",
    )
    index.add_argument("--entries", default=str(catalog_module.ENTRIES_DIR), help="folder of entry files")
    index.add_argument("--wanted", default=str(catalog_module.WANTED_FILE), help="the wanted-kernels file")
    index.add_argument("--results", help="benchmark results folder (default: the repository's, when present)")
    commands = index.add_subparsers(dest="index_command", required=True, metavar="COMMAND")

    p = commands.add_parser("search", help="entries ranked by name, tags and description")
    p.add_argument("text", nargs="+", help="words to look for")
    p.add_argument("--tag", help="only entries with this tag")
    p.set_defaults(run=_cmd_search)

    p = commands.add_parser("show", help="one entry in full, with its usage")
    p.add_argument("name")
    p.set_defaults(run=_cmd_show)

    commands.add_parser("tags", help="the tag vocabulary and how many entries use each").set_defaults(run=_cmd_tags)
    commands.add_parser("wanted", help="kernels still needed, why, and the closest work").set_defaults(run=_cmd_wanted)
    p = commands.add_parser("validate", help="check every entry file; name the file and field of each problem")
    p.set_defaults(run=_cmd_validate)

    p = commands.add_parser("verify", help="run external entries' usage against a torch reference")
    p.add_argument("names", nargs="*", help="entry names (default: all)")
    p.set_defaults(run=_cmd_verify)

    p = commands.add_parser("add", help="write a new, valid entry file (flags, or prompts on a terminal)")
    for field, label, is_list in _ADD_FIELDS:
        flag = {"tags": "--tag", "dtypes": "--dtype"}.get(field, f"--{field}")
        if is_list:
            p.add_argument(flag, dest=field, action="append", help=f"{label.split(',')[0]} (repeatable)")
        else:
            p.add_argument(flag, dest=field, help=label)
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=None, help="has a backward")
    p.add_argument("--notes", help="notes")
    p.add_argument("--package", help="the pip package that ships it")
    p.set_defaults(run=_cmd_add)

    p = commands.add_parser("measured", help="write the summary of benchmarks/results that ships in the package")
    p.add_argument("--out", default=str(measured.SUMMARY_FILE), help="where to write it (default: the package's)")
    p.add_argument("--check", action="store_true", help="only say whether the file is up to date (exit 1 if not)")
    p.set_defaults(run=_cmd_measured)

    p = commands.add_parser("render", help="Markdown list grouped by tag, or a static HTML site")
    p.add_argument("--format", choices=("md", "html"), default="md")
    p.add_argument("--out", help="file (md; default: stdout) or folder (html, required)")
    p.set_defaults(run=_cmd_render)
