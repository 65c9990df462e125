"""``python -m pytest_osprey``: a pilot run without pytest, re-judging a saved campaign, and the
pilot file's and summary.json's schemas and references."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_USAGE = 4

DESCRIPTION = """Keep or drop a speculative-decoding drafter, decided with evidence.
`run PILOT` does what `pytest --osprey-config=PILOT` does, without pytest: preflight, campaign,
judgement, reports, the same results folder and exit codes (0 every gate passed, 1 a gate
failed, 4 usage error)."""


def _run(args: argparse.Namespace) -> int:
    from .campaign import ProgressEvent
    from .report.terminal import text_table
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
    for result in outcome.gates:
        mark = "FAIL" if run.fails(result) else result.label.upper()
        if result.outcome != "pass" or run.fails(result) or result.evidence != "tested":
            print(f"{mark:12} {result.spec.kind}[{result.spec.id}]: "
                  f"{result.summary.splitlines()[0]}")
    if outcome.campaign_error:
        print(f"campaign error: {outcome.campaign_error}", file=sys.stderr)
    if outcome.judgement is not None:
        print("\n".join(text_table(outcome.judgement.figures)))
        for v in outcome.judgement.verdicts:
            print(v.line())
    elif run.dry_run:
        print(f"dry run: {len(outcome.gates)} preflight check(s), nothing was booted")
    for path in outcome.reports:
        print(f"results: {path}")
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
    for v in judgement.verdicts:
        print(v.line())
    return 0 if all(v.verdict == "KEEP" for v in judgement.verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_osprey", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Run a pilot without pytest (same results and exit codes)")
    run.add_argument("pilot", help="The pilot file (pilot.yaml)")
    run.add_argument("--results", metavar="DIR", help="Results folder")
    run.add_argument("--reuse", metavar="DIR", help="Judge a saved campaign; boot nothing")
    run.add_argument("--dry-run", action="store_true",
                     help="Check the pilot, command lines and artifacts only; boot nothing")
    run.add_argument("--conditions", metavar="A,B",
                     help="Run only these conditions (the baseline is always included)")
    run.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    rep = sub.add_parser("report", help="Re-judge a results folder and rewrite its reports")
    rep.add_argument("directory", help="A results folder (holds campaign.json)")
    rep.add_argument("--config", help="Pilot whose limits to apply (default: the saved copy)")
    rep.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    sub.add_parser("schema", help="Print the JSON Schema of pilot.yaml (for editor completion)")
    sub.add_parser("reference", help="Print the pilot.yaml reference (Markdown)")
    sub.add_parser("summary-schema", help="Print the JSON Schema of summary.json")
    sub.add_parser("summary-reference", help="Print the summary.json reference (Markdown)")
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
