"""``python -m pytest_osprey``: a pilot run without pytest, re-judging a saved campaign, a pilot
written for a stack (``init``), and the pilot file's and summary.json's schemas and references.

Every problem is one line on stderr, never a traceback; exit codes: 0 every gate passed,
1 a gate failed (or the campaign could not run), 2 interrupted (or a saved campaign that is
partial: no verdict), 3 an internal error, 4 a usage error (pilot, options, folders).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report.console import Line as Line

from .exit_codes import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE

_INTERRUPTED: list[bool] = []  # set when a run was interrupted (cli() then exits at once)

DESCRIPTION = """Keep or drop a speculative-decoding drafter, decided with evidence.
`run PILOT` does what `pytest --osprey-config=PILOT` does, without pytest: preflight, campaign,
judgement, reports, the same results folder and exit codes (0 every gate passed, 1 a gate
failed, 2 interrupted or a partial campaign, 3 internal error, 4 usage error)."""


def _say(text: str, err: bool = False) -> None:
    """One line to the terminal. A closed stream or a reader that went away (``| head -1``)
    silences the output, never the run: what it measured is written to its folder all the
    same, and the exit code stays the run's."""
    from .results.redact import scrub

    _write(scrub(text) + "\n", err)


def _write(text: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    if stream is None or getattr(stream, "closed", False):
        return
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        # Point the descriptor at /dev/null so the interpreter's own flush at exit is quiet.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
    except (OSError, ValueError):  # a stream closed under us
        pass


def _tty() -> bool:
    stream = sys.stdout
    try:
        return stream is not None and not stream.closed and stream.isatty()
    except (OSError, ValueError):
        return False


EXAMPLES = """examples:
  python -m pytest_osprey init --engine sglang --target MODEL --drafter eagle3=DIR ...
  python -m pytest_osprey run pilot.yaml --dry-run     check the pilot and artifacts only
  python -m pytest_osprey run pilot.yaml --results out measure, judge, write out/report.html
  python -m pytest_osprey report out                   judge a saved campaign again
  python -m pytest_osprey k8s pilot.yaml --shards 4 --image IMG --out osprey.yaml
  python -m pytest_osprey trace build logs.jsonl --out prompts/ours.jsonl --size 50"""


_ANSI = {"red": "31", "green": "32", "yellow": "33", "bold": "1"}


def _styled(line: Line, color: bool) -> str:
    codes = [_ANSI[w] for w in line.style.split() if w in _ANSI]
    if not color or not codes or not line.text:
        return line.text
    return f"\x1b[{';'.join(codes)}m{line.text}\x1b[0m"


def _run(args: argparse.Namespace) -> int:
    from .campaign import ProgressEvent
    from .engines.stopping import INTERRUPT_GRACE_S
    from .judgement import PREFLIGHT
    from .report.console import Line, closing_lines, dry_run_lines
    from .run.pilot_run import PilotRun, RunOptions, UsageError, sigterm_interrupts, stop_servers
    from .shards.plan import ShardError, parse_shard

    last: list[tuple[str, str, str, int, str]] = []

    def progress(event: ProgressEvent) -> None:
        key = event.key
        finished = bool(event.total) and event.done == event.total
        if not last or key != last[-1] or finished:
            last[:] = [key]
            _say(event.line(finished))

    try:
        shard = parse_shard(args.shard) if args.shard is not None else None  # "" is refused
        options = RunOptions(results=args.results, reuse=args.reuse, dry_run=args.dry_run,
                             conditions=args.conditions.split(",") if args.conditions else None,
                             compare=args.compare, reuse_hint="--reuse DIR (or `report DIR`)",
                             shard=shard)
        run = PilotRun(args.pilot, options, progress=progress)
    except ShardError as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    except UsageError as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    for note in run.notes:  # a partial saved campaign, a bind address: said first
        _say(f"warning: {note}", err=True)
    if run.size is not None and not args.reuse:
        from .judgement import design_sees, sampling_budget_sees

        _say(f"[osprey] {run.size.line()}")
        sees = sampling_budget_sees(run.pilot, len(run.trace.prompts)) if run.trace else None
        if sees:
            _say(f"[osprey] quality: {sees}")
        if run.trace:
            _say(f"[osprey] speed: {design_sees(run.pilot, len(run.trace.prompts)).line()}")
    shown = len(run.notes)
    try:
        with sigterm_interrupts():
            outcome = run.run()
    except KeyboardInterrupt:
        _INTERRUPTED.append(True)
        stop_servers(INTERRUPT_GRACE_S)
        for note in run.notes[shown:]:
            _say(f"warning: {note}", err=True)
        _say(f"INTERRUPTED: {run.partial}; judged as measured, no verdict" if run.partial
             else "interrupted before the campaign started", err=True)
        for path in run.reports:
            _say(f"results: {path}")
        return EXIT_INTERRUPTED
    finally:
        stop_servers()
    for note in run.notes[shown:]:
        _say(f"warning: {note}", err=True)
    lines: list[Line] = []
    for result in outcome.gates:
        if run.fails(result) and result.spec.kind in PREFLIGHT:
            lines.append(Line(f"FAILED {result.spec.kind} {result.spec.condition}: "
                              f"{result.summary.splitlines()[0] if result.summary else ''}",
                              "red"))
    if outcome.campaign_error:
        _say(f"campaign error: {outcome.campaign_error}", err=True)
    if outcome.partial:
        _say(f"INTERRUPTED: {outcome.partial}; judged as measured, no verdict", err=True)
    if outcome.judgement is not None:
        data = run.judged_data
        assert data is not None  # judged, so judged from something
        lines += closing_lines(run.pilot, outcome.judgement, data, outcome.comparison,
                               outcome.reports)
    elif run.dry_run and run.checked is not None:
        lines += dry_run_lines(run.checked, run.conditions)
    color = _tty() and "NO_COLOR" not in os.environ
    for line in lines:
        _say(_styled(line, color))
    return outcome.exit_code


def _report(args: argparse.Namespace) -> int:
    """Judge a saved campaign again into a new, marked ``rejudged-<time>/`` folder inside it
    (compared with an earlier campaign when given); the original reports stay as they are."""
    from .run.pilot_run import UsageError
    from .run.rejudge import rejudge

    try:
        run = rejudge(Path(args.directory), Path(args.config) if args.config else None,
                      Path(args.compare) if args.compare else None)
    except UsageError as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    shown = len(run.notes)
    for note in run.notes:  # a partial campaign: said before anything else
        _say(f"warning: {note}", err=True)
    judgement = run.judgement()
    for note in run.notes[shown:]:
        _say(f"warning: {note}", err=True)
    if run.write_error:
        _say(f"error: {run.write_error}", err=True)
        return EXIT_USAGE
    for path in run.reports:
        _say(str(path))
    from .report.headline import bullet_lines, headline

    for warning in judgement.stability.warnings:  # as the run's own closing lines say them
        _say(f"WARNING: {warning}")
    for d in judgement.diagnoses:
        _say(headline(d))
        for line in bullet_lines(d):
            _say(line)
    return run.exit_code()


def _merge(args: argparse.Namespace) -> int:
    """Pool shards into one judged folder: the run's exit status (0 no gating gate failed, 1
    one did, 2 a partial merge: no verdict), 4 refused."""
    from .report.headline import headline
    from .shards.merge import MergeError, merge_shards

    try:
        merged = merge_shards(Path(args.out), [Path(d) for d in args.shards],
                              partial=args.partial, heterogeneous=args.allow_heterogeneous)
    except MergeError as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    for note in merged.notes:
        _say(f"warning: {note}", err=True)
    for path in merged.reports:
        _say(f"results: {path}")
    for d in merged.diagnoses:
        _say(headline(d))
    return merged.exit_code


def _ray(args: argparse.Namespace) -> int:
    """The shards as Ray tasks, then the merge: the merge's exit codes."""
    from .report.headline import headline
    from .run.folders import LOCK, FolderError, default_results
    from .run.pilot_run import PilotRun, RunOptions, UsageError
    from .shards.merge import MergeError
    from .shards.ray import RayError, check_gpus, launch

    if args.shards < 1:
        _say(f"error: --shards {args.shards}: needs at least 1", err=True)
        return EXIT_USAGE
    try:
        from .shards.plan import Shard

        check_gpus(args.gpus_per_shard)
        checked = PilotRun(args.pilot, RunOptions(dry_run=True, shard=Shard(1, args.shards)))
        if args.results:
            out = Path(args.results)
        else:  # a new name, left free: the launcher claims OUT-shards/ and merges into OUT
            out = default_results(Path.cwd(), checked.pilot.name)
            (out / LOCK).unlink()
            out.rmdir()
        done = launch(checked.pilot_path, checked.pilot, args.shards, out,
                      address=args.address, gpus_per_shard=args.gpus_per_shard)
    except (UsageError, RayError, MergeError, FolderError) as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    for k, why in sorted(done.dead.items()):
        _say(f"warning: shard {k}: {why}; the merge is partial", err=True)
    for path in done.merged.reports:
        _say(f"results: {path}")
    for d in done.merged.diagnoses:
        _say(headline(d))
    return done.exit_code


def _trace_build(args: argparse.Namespace) -> int:
    """A trace from a product's own logs or sets: exit 0 written, 4 bad input (nothing
    written)."""
    from .trace_build import (
        BuildError,
        BuildOptions,
        Fields,
        RedactionError,
        Redactor,
        SourceError,
        build,
        load_hook,
        summary_lines,
    )
    from .trace_build.build import compile_pattern, parse_rule

    try:
        patterns = [] if args.redact == "none" else [p for p in args.redact.split(",") if p]
        hook = load_hook(args.redact_hook) if args.redact_hook else None
        options = BuildOptions(
            sources=[Path(s) for s in args.sources], out=Path(args.out), size=args.size,
            seed=args.seed, fmt=args.format,
            fields=Fields(text=args.text_field, domain=args.domain_field,
                          completion=args.completion_field, reference=args.reference_field),
            domain_rules=[parse_rule(r) for r in args.domain_rule],
            default_domain=args.default_domain,
            unusual_domains=[d for d in (args.unusual_domains or "").split(",") if d],
            unusual_rule=compile_pattern(args.unusual_rule, "--unusual-rule")
            if args.unusual_rule else None,
            unusual_share=args.unusual_share, tokenizer=args.tokenizer,
            max_new_tokens_cap=args.max_new_tokens_cap, near_duplicate=args.near_duplicate,
            redactor=Redactor(patterns, hook, args.redact_hook), force=args.force)
        built = build(options)
    except (BuildError, SourceError, RedactionError) as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    except MemoryError:
        _say("error: out of memory reading the sources; split them or give fewer", err=True)
        return EXIT_USAGE
    for line in summary_lines(built):
        _say(line)
    return 0


def _init(args: argparse.Namespace) -> int:
    """Write the pilot (exit 4: a value missing or wrong, or the file exists), then dry-run it
    as `run --dry-run` does: its exit code."""
    from .init_pilot import InitError, init
    from .pilot.base import ConfigError

    stdin = sys.stdin
    try:
        written = init(args, input if stdin is not None and stdin.isatty() else None)
    except (InitError, ConfigError) as exc:
        _say(f"error: {exc}", err=True)
        return EXIT_USAGE
    for line in written.lines:
        _say(line)
    if args.no_dry_run:
        return 0
    return _run(argparse.Namespace(pilot=str(written.path), results=None, reuse=None,
                                   dry_run=True, conditions=None, compare=None, shard=None))


def _print_json(make: Callable[[], object]) -> None:
    _write(json.dumps(make(), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_osprey", description=DESCRIPTION,
                                     epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text + ".")

    run = command("run", "Run a pilot without pytest (same results and exit codes)")
    run.add_argument("pilot", help="The pilot file (pilot.yaml)")
    run.add_argument("--results", metavar="DIR", help="Results folder (new or empty)")
    run.add_argument("--reuse", metavar="DIR", help="Judge a saved campaign; boot nothing")
    run.add_argument("--dry-run", action="store_true",
                     help="Check the pilot, command lines and artifacts only; boot nothing")
    run.add_argument("--conditions", metavar="A,B",
                     help="Run only these conditions (the baseline is always included)")
    run.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    run.add_argument("--shard", metavar="K/N",
                     help="Run shard K of N (1-based): a disjoint share of the plan's passes, "
                          "every condition; pool the shards with `merge`")
    merge = command("merge", "Pool shard results folders into one judged results folder OUT")
    merge.add_argument("out", metavar="OUT", help="The merged results folder (new or empty)")
    merge.add_argument("shards", metavar="DIR", nargs="+", help="The shards' results folders")
    merge.add_argument("--partial", action="store_true",
                       help="Merge although shards are missing or incomplete (labelled "
                            "partial: no verdict is claimed for data that is not there)")
    merge.add_argument("--allow-heterogeneous", action="store_true",
                       help="Merge shards whose hardware, engine version or model digests "
                            "differ (each machine a stratum; the heterogeneity is reported)")
    ray = command("ray", "Run a pilot's shards as Ray tasks, gather and merge them (early "
                  "stopping across shards)")
    ray.add_argument("pilot", help="The pilot file (pilot.yaml), readable on every node")
    ray.add_argument("--shards", type=int, required=True, metavar="N", help="Shards (tasks)")
    ray.add_argument("--address", metavar="ADDR",
                     help="The Ray cluster (default: RAY_ADDRESS, else a local one)")
    ray.add_argument("--gpus-per-shard", type=float, default=0.0, metavar="G",
                     help="GPUs each shard's task needs (default 0)")
    ray.add_argument("--results", metavar="OUT",
                     help="The merged results folder (new or empty; the shards' folders go "
                          "beside it, OUT-shards/)")
    rep = command("report", "Re-judge a results folder into DIR/rejudged-<time>/ (the original "
                  "reports stay as they are)")
    rep.add_argument("directory", help="A results folder (holds campaign.json)")
    rep.add_argument("--config", help="Pilot whose limits to apply (default: the pilot saved "
                     "in campaign.json)")
    rep.add_argument("--compare", metavar="DIR",
                     help="An earlier campaign of the same trace to hold its kept drafters to")
    from .shards.k8s import add_arguments as k8s_arguments

    k8s_arguments(command("k8s", "Write Kubernetes manifests: an Indexed Job of shards, their "
                          "results store and a merge Job without a GPU"))
    from .trace_build.arguments import add_arguments as trace_arguments

    trace_arguments(command("trace", "Build a trace from a product's own traffic"))
    from .init_pilot import add_arguments as init_arguments

    init_arguments(command("init", "Write a commented pilot for your stack (flags, or prompts "
                           "in a terminal), then dry-run it"))
    command("schema", "Print the JSON Schema of pilot.yaml (for editor completion)")
    command("reference", "Print the pilot.yaml reference (Markdown)")
    command("summary-schema", "Print the JSON Schema of summary.json")
    command("summary-reference", "Print the summary.json reference (Markdown)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage; this tool's usage code is 4
        return EXIT_USAGE if exc.code not in (0, None) else 0
    try:
        return _command(args)
    except KeyboardInterrupt:
        _INTERRUPTED.append(True)
        _say("interrupted", err=True)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: one line, not a traceback (OSPREY_DEBUG=1 shows it)
        if os.environ.get("OSPREY_DEBUG"):
            raise
        _say(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} "
             "(OSPREY_DEBUG=1 shows the traceback)", err=True)
        return EXIT_INTERNAL


def _command(args: argparse.Namespace) -> int:
    if args.command == "run":
        return _run(args)
    if args.command == "k8s":
        from .pilot.base import ConfigError
        from .shards.k8s import command as k8s_command

        try:
            k8s_command(args)
        except ConfigError as exc:
            _say(f"error: {exc}", err=True)
            return EXIT_USAGE
    if args.command == "report":
        return _report(args)
    if args.command == "merge":
        return _merge(args)
    if args.command == "ray":
        return _ray(args)
    if args.command == "trace":
        return _trace_build(args)
    if args.command == "init":
        return _init(args)
    if args.command == "schema":
        from .pilot.schema import json_schema

        _print_json(json_schema)
    elif args.command == "reference":
        from .pilot.reference import render

        _write(render())
    elif args.command == "summary-schema":
        from .report.summary_schema import json_schema as summary_json_schema

        _print_json(summary_json_schema)
    elif args.command == "summary-reference":
        from .report.summary_reference import render_reference

        _write(render_reference())
    return 0


def cli() -> None:
    """The console entry point: :func:`main`, then an interrupted run ends at once.

    Its results are written and its servers stopped by then; the interpreter's own teardown
    (torch's above all: seconds on a busy machine) would only delay the exit a CI runner
    waits for after its SIGTERM before it kills."""
    code = main()
    if _INTERRUPTED:
        _write("")
        _write("", err=True)
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    cli()
