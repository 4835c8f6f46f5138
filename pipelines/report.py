"""Render results/ from the committed run records (never W&B):
``python -m pipelines.report [--runs <out>/records] [--out results] [--scale cpu --scale paper]
[--carry-over | --render-empty]``; render your own runs elsewhere with
``--runs runs --out runs/report``. ``--add-records`` first exports the finished runs under
``--runs`` (not smoke or ad-hoc ones) as records under <out>/records/ (tape/report/records.py),
never overwriting one.

Refuses (exit 1, writing nothing) when a rendered scale has no finished run, when a number in
the output's runs.csv has no finished run behind it any more (a fresh clone has no runs/, or a
render of another scale), or when a run it shows has no run of the same command and seed under
--runs (a subset of the seeds): the committed results are never replaced by "not run" or by
fewer seeds unless --render-empty asks for it. --add-records refuses --runs that overlap the records.
--carry-over loses nothing instead: a section none of whose runs is under --runs (say addition,
run on another machine), or whose runs here lack a PE that runs.csv had numbers for, is copied
unchanged from the previous README, with a note that says why; its tables and figures are left
as they are and its rows stay in runs.csv. ``make reproduce-table`` renders this way.

Writes results/README.md (every table beside the paper's numbers, with provenance), the Claims
section's detail results/claims_detail.md (every comparison, every arm, notes, figures),
results/tables/*.csv and *.tex, results/figures/*.png and results/runs.csv. See tape/report/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pipelines.presets import preset_setting
from tape.report.records import RecordConflict, export_all
from tape.report.render import WouldLoseResults, render


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=None,
                        help="run directories or records (default: <out>/records, the committed records)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results)")
    parser.add_argument("--scale", action="append", dest="scales", metavar="SCALE",
                        help="render this scale (repeatable); default: cpu and every scale found "
                             "except smoke")
    parser.add_argument("--carry-over", action="store_true",
                        help="keep the previous render's section, tables, figures and runs.csv rows "
                             "of each experiment whose numbers the runs under --runs would drop")
    parser.add_argument("--add-records", action="store_true",
                        help="export the finished runs under --runs to <out>/records/ first (never "
                             "overwriting a record), then render from the records")
    parser.add_argument("--render-empty", action="store_true",
                        help="render even where that writes \"not run\" over existing numbers")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"pipelines.report: --out {args.out} is a file; give a folder (results/ or a new one)", file=sys.stderr)
        return 1
    records = args.out / "records"
    args.runs = args.runs or records
    runs_at, records_at = args.runs.resolve(), records.resolve()
    if args.add_records and runs_at != records_at and (runs_at.is_relative_to(records_at)
                                                        or records_at.is_relative_to(runs_at)):
        print(f"pipelines.report: --runs {args.runs} and {records} overlap, so --add-records would copy "
              f"records into themselves: point --runs at the run directories (e.g. runs/)", file=sys.stderr)
        return 1
    if args.add_records and runs_at != records_at:
        try:
            added = export_all(args.runs, records)
        except RecordConflict as err:
            print(f"pipelines.report: {err}", file=sys.stderr)
            return 1
        print(f"records: {len(added)} new under {records}/")
        args.runs = records
    try:
        done = render(args.runs, args.out, args.scales, allow_empty=args.render_empty,
                      carry_over=args.carry_over, preset=preset_setting)
    except WouldLoseResults as err:
        carry = "" if args.carry_over else "pass --carry-over to keep the sections whose runs are not here, "
        print(f"pipelines.report: refusing to render into {args.out}/ (nothing written): {err}.\n"
              f"Point --runs at the run directories, {carry}or pass --render-empty to write "
              f"\"not run\" cells anyway (make report REPORT_ARGS=--render-empty).", file=sys.stderr)
        return 1
    print(f"wrote {len(done.files)} files under {args.out}/ (see {args.out / 'README.md'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
