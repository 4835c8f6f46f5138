"""Render results/ from the run directories (never W&B):
``python -m pipelines.report [--runs runs] [--out results] [--scale cpu --scale paper]
[--render-empty]``.

Refuses (exit 1, writing nothing) when a rendered scale has no finished run, or when a number
in the output's runs.csv has no finished run behind it any more (a fresh clone has no runs/):
the committed results are never replaced by "not run" unless --render-empty asks for it.

Writes results/README.md (every table beside the paper's numbers, with provenance),
results/tables/*.csv and *.tex, results/figures/*.png and results/runs.csv. See tape/report/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from tape.report.render import WouldLoseResults, render


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="run directories (default: runs)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results)")
    parser.add_argument("--scale", action="append", dest="scales", metavar="SCALE",
                        help="render this scale (repeatable); default: cpu and every scale found "
                             "except smoke")
    parser.add_argument("--render-empty", action="store_true",
                        help="render even where that writes \"not run\" over existing numbers")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        done = render(args.runs, args.out, args.scales, allow_empty=args.render_empty)
    except WouldLoseResults as err:
        print(f"pipelines.report: refusing to render into {args.out}/ (nothing written): {err}.\n"
              f"Point --runs at the run directories, or pass --render-empty to write \"not run\" "
              f"cells anyway (make report REPORT_ARGS=--render-empty).", file=sys.stderr)
        return 1
    print(f"wrote {len(done.files)} files under {args.out}/ (see {args.out / 'README.md'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
