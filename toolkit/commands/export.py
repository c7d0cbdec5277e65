"""``srl export RUN [--step N] DIR``: a run's checkpoint as a Hugging Face model directory (transformers, vLLM).

Parsing happens here without torch, so ``srl export --help`` and a refused target answer at once; the weights are
loaded by :mod:`toolkit.trainer.export` only when there is something to export.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``srl export``: 0 on success, 2 when the run, step or target is refused (message on stderr)."""
    p = argparse.ArgumentParser(
        prog="srl export",
        description="Write one complete checkpoint of a run (RL or SFT) as a Hugging Face model directory that "
        "transformers and vLLM load as is. A LoRA run's adapter is merged into its base model.",
    )
    p.add_argument("run", type=Path, metavar="RUN", help="the run directory (outputs/<run name>)")
    p.add_argument("out", type=Path, metavar="DIR", help="where to write the model (a new or empty directory)")
    p.add_argument(
        "--step", type=int, default=None, metavar="N", help="checkpoint step to export (default: the newest complete)"
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out.absolute()
    # Refused before torch is imported: these need no weights.
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"srl export: {out} exists and is not an empty directory; give a new or empty directory", file=sys.stderr)
        return 2
    if not args.run.is_dir():
        print(f"srl export: {args.run}: no such run directory", file=sys.stderr)
        return 2
    from toolkit.trainer.export import ExportError, export_checkpoint

    try:
        done = export_checkpoint(args.run, out, args.step)
    except ExportError as e:
        print(f"srl export: {e}", file=sys.stderr)
        return 2
    merged = " (LoRA adapter merged into its base)" if done.merged_lora else ""
    print(f"exported checkpoint step {done.step} of {args.run} to {done.path}{merged}")
    return 0
