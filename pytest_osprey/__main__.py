"""`python -m pytest_osprey schema` prints the pilot file's JSON Schema."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_osprey")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("schema", help="Print the JSON Schema of pilot.yaml (for editor completion)")
    sub.add_parser("reference", help="Print the pilot.yaml reference (Markdown)")
    args = parser.parse_args(argv)
    if args.command == "schema":
        from .config import json_schema

        json.dump(json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.command == "reference":
        from .reference import render

        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
