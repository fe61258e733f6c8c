"""The command line the sweep scripts share: ``--out DIR`` for the results and ``--dry-run`` for a check on the CPU.

``--dry-run`` sets TRITON_INTERPRET=1, which Triton reads as each kernel is defined, so a script parses its
arguments with :func:`parse` before it imports tritonkit; without ``--dry-run`` an ``--out`` is required.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def parse(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """``parser``'s arguments with --out and --dry-run added; the interpreter switched on for a dry run."""
    parser.add_argument("--out", type=Path, help="the folder the dated results are written to")
    parser.add_argument("--dry-run", action="store_true", help="small shapes on the CPU interpreter, no times")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    elif args.out is None:
        parser.error("--out DIR is needed (unless --dry-run)")
    return args
