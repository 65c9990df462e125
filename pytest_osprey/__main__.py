"""Command line: the pilot file's and summary.json's JSON Schemas and references, and
re-judging a saved campaign (``python -m pytest_osprey --help``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def report(directory: Path, config: Path | None, earlier: Path | None = None) -> int:
    """Judge a saved campaign again and rewrite summary.json, report.md and report.html
    (compared with an ``earlier`` campaign when given)."""
    from .campaign import load_campaign
    from .config import ConfigError, load_pilot_unchecked
    from .decision import plan_gates
    from .history import HistoryError, compare, open_previous
    from .judgement import judge
    from .report.summary import write_reports

    try:
        pilot = load_pilot_unchecked(config or directory / "pilot.yaml")
        data = load_campaign(directory)
        preflight_path = directory / "preflight.json"
        preflight = json.loads(preflight_path.read_text("utf-8")) if preflight_path.is_file() \
            else {}
        previous = open_previous(earlier, str(data.meta.get("trace_hash"))) if earlier else None
    except HistoryError as exc:
        print(f"error: --compare: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    conditions = [c for c in pilot.conditions if c in data.meta.get("conditions", {})]
    judgement = judge(pilot, plan_gates(pilot, conditions), data, preflight)
    comparison = None if previous is None else compare(
        pilot, data, judgement, previous, pilot.decision.regression_tolerance)
    for path in write_reports(directory, judgement, data, pilot, comparison):
        print(path)
    for v in judgement.verdicts:
        print(v.line())
    return 0 if all(v.verdict == "KEEP" for v in judgement.verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_osprey")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("schema", help="Print the JSON Schema of pilot.yaml (for editor completion)")
    sub.add_parser("reference", help="Print the pilot.yaml reference (Markdown)")
    sub.add_parser("summary-schema", help="Print the JSON Schema of summary.json")
    sub.add_parser("summary-reference", help="Print the summary.json reference (Markdown)")
    rep = sub.add_parser("report", help="Re-judge a results folder and rewrite its reports")
    rep.add_argument("directory", help="A results folder (holds campaign.json)")
    rep.add_argument("--config", help="Pilot whose limits to apply (default: the saved copy)")
    rep.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    args = parser.parse_args(argv)
    if args.command == "schema":
        from .config import json_schema

        json.dump(json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.command == "reference":
        from .reference import render

        sys.stdout.write(render())
    elif args.command == "summary-schema":
        from .report.summary_schema import json_schema as summary_json_schema

        json.dump(summary_json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.command == "summary-reference":
        from .report.summary_schema import render_reference

        sys.stdout.write(render_reference())
    elif args.command == "report":
        return report(Path(args.directory), Path(args.config) if args.config else None,
                      Path(args.compare) if args.compare else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
