"""The example outputs the docs show, generated from a real run of the shipped pilot.

``examples/first-run/run/`` holds that run's results folder (records, scores and
campaign.json compressed); ``examples/first-run/terminal.txt`` and ``report.md`` are what the
plugin prints and writes when it judges it, re-judged by ``pytest --osprey-config=...
--osprey-reuse`` with this checkout's code, so the docs show the output format of the code
beside them. tests/docs/test_doc_examples.py fails when the committed outputs drift from what the
code renders; this script renews them.

    python examples/make_examples.py                   # re-render from the stored run
    python examples/make_examples.py --from-run DIR    # store a new real run first, then render
    python examples/make_examples.py --check           # exit 1 with a diff where they drifted

A new run: ``pytest --osprey-config=pilot.yaml --osprey-results DIR`` on an idle machine.
"""

from __future__ import annotations

import argparse
import difflib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "first-run"
STORED = EXAMPLE / "run"
COMPRESSED = ("records.jsonl", "scores.jsonl", "campaign.json")  # xz: the tree is small
KEPT = ("pilot.yaml", "preflight.json")
WIDTH = 120
README = ROOT / "README.md"
# The README shows the pilot's summary (GitHub renders no includes): the script writes it
# between these markers, and --check compares it too.
BEGIN, END = "<!-- example: first-run summary -->", "<!-- /example -->"


def store(run: Path) -> None:
    """Copy a finished results folder into STORED: its inputs to judging, the big ones
    xz-compressed, and the trace files it replayed."""
    if not (run / "campaign.json").is_file():
        raise SystemExit(f"{run}: no campaign.json there (not a results folder)")
    shutil.rmtree(STORED, ignore_errors=True)
    STORED.mkdir(parents=True)
    for name in KEPT:
        if (run / name).is_file():
            shutil.copyfile(run / name, STORED / name)
    for name in COMPRESSED:
        if (run / name).is_file():
            with (run / name).open("rb") as src, \
                    lzma.open(STORED / f"{name}.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as dst:
                shutil.copyfileobj(src, dst)
    meta = json.loads((run / "campaign.json").read_text())
    for rel, src in zip(trace_files(), meta["trace_files"], strict=True):
        if not Path(src).is_file():
            raise SystemExit(f"{src}: the run's trace file is gone: run the pilot again")
        (STORED / "trace" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, STORED / "trace" / rel)


def trace_files() -> list[str]:
    """The trace files of the stored run's pilot, relative to the checkout (as the shipped
    pilot names them)."""
    pilot = yaml.safe_load((STORED / "pilot.yaml").read_text())
    return [str(f) for f in pilot["trace"]["files"]]


def unpack(into: Path) -> Path:
    """The stored run as a results folder in ``into/results`` (a scratch copy: re-judging
    writes), beside its pilot as it ran and the trace files it replayed, at the paths the pilot
    names: the judgement sees the campaign as it was, whatever the checkout's trace is now.
    The models are the checkout's (re-judging loads none)."""
    folder = into / "results"
    folder.mkdir()
    shutil.copyfile(STORED / "pilot.yaml", into / "pilot.yaml")
    for rel in trace_files():
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STORED / "trace" / rel, into / rel)
    (into / "fixtures").symlink_to(ROOT / "fixtures")
    for name in KEPT:
        if (STORED / name).is_file():
            shutil.copyfile(STORED / name, folder / name)
    for name in COMPRESSED:
        if (STORED / f"{name}.xz").is_file():
            with lzma.open(STORED / f"{name}.xz", "rb") as src, (folder / name).open("wb") as dst:
                shutil.copyfileobj(src, dst)
    meta = json.loads((folder / "campaign.json").read_text())
    meta["trace_files"] = [str(into / rel) for rel in trace_files()]  # where they are now
    (folder / "campaign.json").write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def normalise(text: str, folder: Path) -> str:
    """What varies from one rendering to the next, or from one machine to another, written
    as it reads in the docs: the scratch folder, the re-judged folder's time, pytest's
    duration; the re-judged copy's mark (the docs show a first run's reports)."""
    text = re.sub(re.escape(str(folder)) + r"/rejudged-\d{8}T\d{6}Z", "results", text)
    text = text.replace(str(folder), "results").replace(str(folder.parent), ".")
    text = re.sub(r" in \d+\.\d+s( \(\d+:\d\d:\d\d\))?", "", text)
    # A first run's reports, as the run wrote them: not marked as a re-judged copy.
    text = re.sub(r"_Re-judged copy \([^)]*\)[^\n]*_\n\n", "", text)
    text = re.sub(r"rejudged-\d{8}T\d{6}Z/", "", text)
    # pytest centres its banners in = signs around text whose length varies (the duration).
    text = re.sub(r"(?m)^=+ (.*?) =+$", r"== \1 ==", text)
    # A failed test's id in the short summary: pytest writes the suite's path relative to the
    # checkout's depth and cuts the message to the width left, so both vary with the checkout's
    # path. The id, as in the suites folder, is what the docs show.
    text = re.sub(r"(?m)^(FAILED|ERROR) \S*?(test_\w+\.py::\S+)( - .*)?$", r"\1 suites/\2", text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def render(into: Path) -> dict[str, str]:
    """terminal.txt and report.md as this checkout renders the stored run."""
    folder = unpack(into)
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1", "PYTHONHASHSEED": "0"}
    env.pop("GITHUB_STEP_SUMMARY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--osprey-config", str(into / "pilot.yaml"), "--osprey-reuse", str(folder)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"re-judging the stored run exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    judged = sorted(folder.glob("rejudged-*"))
    if not judged:
        raise SystemExit("re-judging the stored run wrote no rejudged-* folder")
    start = proc.stdout.find("== osprey pilot ==")
    terminal = proc.stdout[proc.stdout.rfind("\n", 0, start) + 1:] if start >= 0 else proc.stdout
    return {"terminal.txt": normalise(terminal, folder),
            "report.md": normalise((judged[-1] / "report.md").read_text(), folder),
            "exit": str(proc.returncode)}


def summary_block(terminal: str) -> str:
    """The pilot's summary from terminal.txt: below its banner, above pytest's short summary."""
    lines = terminal.splitlines()
    start = next(i for i, line in enumerate(lines) if "osprey pilot" in line) + 1
    end = next((i for i, line in enumerate(lines) if "short test summary info" in line),
               len(lines))
    return "\n".join(lines[start:end]).strip("\n")


def with_readme_block(readme: str, terminal: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md: no {BEGIN} ... {END} markers for the example")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n```\n{summary_block(terminal)}\n```\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-run", type=Path, help="store this results folder first")
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed outputs instead of writing them")
    args = parser.parse_args()
    if args.from_run:
        store(args.from_run)
    with tempfile.TemporaryDirectory() as tmp:
        outputs = render(Path(tmp))
    outputs["exit.json"] = json.dumps({"exit_code": int(outputs.pop("exit"))}) + "\n"
    readme = with_readme_block(README.read_text(), outputs["terminal.txt"])
    if args.check:
        if readme != README.read_text():
            print("README.md's example summary drifted from examples/first-run/terminal.txt")
        drift = [line for name, text in outputs.items()
                 for line in difflib.unified_diff(
                     (EXAMPLE / name).read_text().splitlines() if (EXAMPLE / name).is_file()
                     else [], text.splitlines(), f"committed {name}", f"rendered {name}",
                     lineterm="")]
        if drift:
            print("\n".join(drift[:200]))
            print("the docs' example outputs drifted from the code: run "
                  "python examples/make_examples.py")
            return 1
        return 0
    for name, text in outputs.items():
        (EXAMPLE / name).write_text(text)
    README.write_text(readme)
    print(f"wrote {', '.join(outputs)} in {EXAMPLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
