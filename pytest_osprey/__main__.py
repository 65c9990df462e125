"""``python -m pytest_osprey``: a pilot run without pytest, re-judging a saved campaign, and the
pilot file's and summary.json's schemas and references."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report.console import Line as Line

EXIT_USAGE = 4

DESCRIPTION = """Keep or drop a speculative-decoding drafter, decided with evidence.
`run PILOT` does what `pytest --osprey-config=PILOT` does, without pytest: preflight, campaign,
judgement, reports, the same results folder and exit codes (0 every gate passed, 1 a gate
failed, 4 usage error)."""

EXAMPLES = """examples:
  python -m pytest_osprey run pilot.yaml --dry-run     check the pilot and artifacts only
  python -m pytest_osprey run pilot.yaml --results out measure, judge, write out/report.html
  python -m pytest_osprey report out                   judge a saved campaign again"""


_ANSI = {"red": "31", "green": "32", "yellow": "33", "bold": "1"}


def _styled(line: Line, color: bool) -> str:
    codes = [_ANSI[w] for w in line.style.split() if w in _ANSI]
    if not color or not codes or not line.text:
        return line.text
    return f"\x1b[{';'.join(codes)}m{line.text}\x1b[0m"


def _run(args: argparse.Namespace) -> int:
    from .campaign import ProgressEvent
    from .report.console import Line, closing_lines, dry_run_lines
    from .run import PilotRun, RunOptions, UsageError, sigterm_interrupts, stop_servers

    last: list[tuple[str, str, str, int]] = []

    def progress(event: ProgressEvent) -> None:
        key = (event.condition, event.phase, event.load, event.block)
        finished = bool(event.total) and event.done == event.total
        if not last or key != last[-1] or finished:
            last[:] = [key]
            print(event.line(finished), flush=True)

    options = RunOptions(results=args.results, reuse=args.reuse, dry_run=args.dry_run,
                         conditions=args.conditions.split(",") if args.conditions else None,
                         compare=args.compare)
    try:
        run = PilotRun(args.pilot, options, progress=progress)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with sigterm_interrupts():
            outcome = run.run()
    finally:
        stop_servers()
    lines: list[Line] = []
    for result in outcome.gates:
        if run.fails(result) and result.spec.kind in ("command_line", "artifact"):
            lines.append(Line(f"FAILED {result.spec.kind} {result.spec.condition}: "
                              f"{result.summary.splitlines()[0]}", "red"))
    if outcome.campaign_error:
        print(f"campaign error: {outcome.campaign_error}", file=sys.stderr)
    if outcome.judgement is not None:
        lines += closing_lines(run.pilot, outcome.judgement, run.campaign(), outcome.comparison,
                               outcome.reports)
    elif run.dry_run and run.checked is not None:
        lines += dry_run_lines(run.checked, run.conditions)
    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    for line in lines:
        print(_styled(line, color))
    return outcome.exit_code


def _report(args: argparse.Namespace) -> int:
    """Judge a saved campaign again and rewrite summary.json, report.md and report.html
    (compared with an earlier campaign when given)."""
    from .run import UsageError, rejudge

    try:
        run = rejudge(Path(args.directory), Path(args.config) if args.config else None,
                      Path(args.compare) if args.compare else None)
        judgement = run.judgement()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for path in run.reports:
        print(path)
    from .judgement.diagnosis import diagnose_all
    from .report.headline import bullet_lines, headline

    for d in diagnose_all(run.pilot, judgement.verdicts, list(judgement.results.values()),
                          judgement.figures, run.campaign()):
        print(headline(d))
        for line in bullet_lines(d):
            print(line)
    return 0 if all(v.verdict == "KEEP" for v in judgement.verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_osprey", description=DESCRIPTION,
                                     epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text + ".")

    run = command("run", "Run a pilot without pytest (same results and exit codes)")
    run.add_argument("pilot", help="The pilot file (pilot.yaml)")
    run.add_argument("--results", metavar="DIR", help="Results folder")
    run.add_argument("--reuse", metavar="DIR", help="Judge a saved campaign; boot nothing")
    run.add_argument("--dry-run", action="store_true",
                     help="Check the pilot, command lines and artifacts only; boot nothing")
    run.add_argument("--conditions", metavar="A,B",
                     help="Run only these conditions (the baseline is always included)")
    run.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    rep = command("report", "Re-judge a results folder and rewrite its reports")
    rep.add_argument("directory", help="A results folder (holds campaign.json)")
    rep.add_argument("--config", help="Pilot whose limits to apply (default: the saved copy)")
    rep.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    command("schema", "Print the JSON Schema of pilot.yaml (for editor completion)")
    command("reference", "Print the pilot.yaml reference (Markdown)")
    command("summary-schema", "Print the JSON Schema of summary.json")
    command("summary-reference", "Print the summary.json reference (Markdown)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage; this tool's usage code is 4
        return EXIT_USAGE if exc.code not in (0, None) else 0
    if args.command == "run":
        return _run(args)
    if args.command == "report":
        return _report(args)
    if args.command == "schema":
        from .pilot.schema import json_schema

        json.dump(json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.command == "reference":
        from .pilot.reference import render

        sys.stdout.write(render())
    elif args.command == "summary-schema":
        from .report.summary_schema import json_schema as summary_json_schema

        json.dump(summary_json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.command == "summary-reference":
        from .report.summary_schema import render_reference

        sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
