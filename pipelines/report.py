"""Render results/ from the run directories (never W&B):
``python -m pipelines.report [--runs runs] [--out results] [--scale cpu --scale paper]``.

Writes results/README.md (every table beside the paper's numbers, with provenance),
results/tables/*.csv and *.tex, results/figures/*.png and results/runs.csv. See tape/report/.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from tape.report.render import render


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="run directories (default: runs)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results)")
    parser.add_argument("--scale", action="append", dest="scales", metavar="SCALE",
                        help="render this scale (repeatable); default: cpu and every scale found "
                             "except smoke")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    done = render(args.runs, args.out, args.scales)
    print(f"wrote {len(done.files)} files under {args.out}/ (see {args.out / 'README.md'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
