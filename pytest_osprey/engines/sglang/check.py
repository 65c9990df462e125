"""SGLang's own checks of each condition's command line, booting nothing (``--osprey-dry-run``).

Two stages, run by the engine's Python in one subprocess:

1. the parser (``prepare_server_args``): unknown flags, bad values. Its complaint is shown as
   SGLang words it, not as the ``SystemExit: 2`` argparse ends with;
2. what SGLang 0.5.23 checks at launch, before any model weight is loaded:
   ``ServerArgs.resolve_once()`` (the resolution pipeline: speculative flags resolved and
   their combinations refused, e.g. STANDALONE with ``--speculative-use-rejection-sampling``)
   then ``check_server_args()``. Resolution reads the model's and drafter's configs, so it
   runs only where both are local folders; where it fails for want of something this
   machine lacks (no accelerator for a GPU deployment, a missing file) the line says it was
   not checked here, not that the configuration is wrong.

Each condition gets its own verdict and only its own errors.

:func:`serving_check` asks the SGLang a condition boots (its interpreter and environment)
whether it serves a multi-layer or Osprey EAGLE-3 draft as trained, which stock SGLang does
not: it imports the draft class's module (the one a drafter's patch adds or changes), reads
whether it builds every layer and honours ``swap_h_and_emb``, and calls the class's
``set_embed`` on a stand-in, as SGLang's EAGLE-3 worker does at load, to see whether the
draft keeps its own embedding. The artifact check reports it.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import EngineError
from ..environment import engine_environ
from ..process import engine_python
from .drafts import OSPREY_PATCH_SGLANG, PATCHED_EAGLE3, DraftLayout
from .engine import KeyFile, sglang_argv

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot

MARK = "OSPREY-SGLANG-CHECK "
SEED_NOTE = ("note: SGLang honours sampling_seed only with --enable-deterministic-inference "
             "(target.deterministic: true): the sampled pass runs, but is not reproducible")

# Exceptions SGLang's resolution raises for a configuration it refuses; anything else
# (RuntimeError for a missing accelerator, OSError, ImportError...) is this machine's lack.
_REFUSALS = ("ValueError", "NotImplementedError", "AssertionError", "TypeError", "KeyError")

_CHECK = r"""
import contextlib, io, json, os, sys
MARK = sys.argv[1]
try:
    import sglang
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
except Exception as exc:
    print(MARK + json.dumps({"importable": False, "why": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
REFUSALS = set(json.loads(sys.argv[2]))
out = {"importable": True, "version": getattr(sglang, "__version__", None), "results": {}}
base = dict(os.environ)
for name, job in json.load(sys.stdin).items():
    res = out["results"][name] = {"parsed": False, "error": None, "launch": None, "detail": None}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(job["argv"])
        if job["algorithm"] is not None:
            SpeculativeAlgorithm.from_string(job["algorithm"])
        res["parsed"] = True
    except SystemExit:
        said = [line for line in err.getvalue().splitlines() if line.strip()]
        res["error"] = said[-1] if said else "refused by the parser"
        continue
    except BaseException as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        continue
    if job["skip"]:
        res["launch"], res["detail"] = "skipped", job["skip"]
        continue
    os.environ.clear()
    os.environ.update({**base, **job["env"]})
    try:
        args.resolve_once()
        args.check_server_args()
        res["launch"] = "ok"
    except BaseException as exc:
        kind = type(exc).__name__
        res["launch"] = "refused" if kind in REFUSALS else "skipped"
        res["detail"] = f"{kind}: {exc}".strip()
    finally:
        os.environ.clear()
        os.environ.update(base)
print(MARK + json.dumps(out))
"""


@dataclass
class Verdict:
    """One condition's command line as SGLang judged it."""

    ok: bool = True
    lines: list[str] = field(default_factory=list)


def _not_local(pilot: Pilot, name: str) -> str | None:
    """Why launch-time checks cannot run here for ``name`` (None: they can)."""
    model = pilot.target.model
    if not Path(model).is_dir():
        return f"the target {model} is not a local folder here"
    drafter = pilot.conditions[name].drafter
    if drafter is not None and not Path(drafter).is_dir():
        return f"the drafter {drafter} is not a folder on this machine"
    return None


def seed_note(pilot: Pilot, argv: list[str]) -> str | None:
    """The sampled pass sends seeds SGLang ignores outside deterministic inference."""
    if pilot.sampling.sampled.enabled and "--enable-deterministic-inference" not in argv:
        return SEED_NOTE
    return None


def dry_run_check(pilot: Pilot, timeout_s: float = 600.0) -> dict[str, Verdict]:
    """Each booted condition's verdict from SGLang's parser and launch-time checks, where the
    engine's Python can import sglang (else a line saying the lines were not checked)."""
    # A real key file (a stand-in key): SGLang reads it as it would the real one.
    dummy = KeyFile("osprey-dry-run-key") if pilot.target.api_key_env else None
    try:
        return _check(pilot, dummy.path if dummy else None, timeout_s)
    finally:
        if dummy is not None:
            dummy.remove()


def _check(pilot: Pilot, key_file: str | None, timeout_s: float) -> dict[str, Verdict]:
    jobs: dict[str, dict[str, Any]] = {}
    for name, cond in pilot.conditions.items():
        if cond.endpoint is not None:
            continue
        try:
            argv = sglang_argv(pilot, name, pilot.target.port or 30000, key_file=key_file)
        except EngineError:
            continue  # no command line to check: the caller reports why
        algorithm = None
        if "--speculative-algorithm" in argv:
            algorithm = argv[argv.index("--speculative-algorithm") + 1]
        jobs[name] = {"argv": argv[3:], "algorithm": algorithm, "env": dict(cond.env),
                      "skip": _not_local(pilot, name)}
    if not jobs:
        return {}
    python = engine_python(pilot.target)

    def everyone(line: str, ok: bool = True) -> dict[str, Verdict]:
        return {name: Verdict(ok, [line]) for name in jobs}

    try:
        # Jobs on stdin, not argv: a condition's env may hold a secret.
        proc = subprocess.run(
            [python, "-c", _CHECK, MARK, json.dumps(_REFUSALS)], input=json.dumps(jobs),
            env=engine_environ(pilot.target.env), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return everyone(f"sglang: could not run SGLang's checks with {python}: {exc}", False)
    found = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if not found:
        tail = (proc.stderr or proc.stdout).strip()[-500:]
        return everyone(f"sglang: SGLang's checks with {python} gave no answer: {tail}", False)
    report = json.loads(found[-1][len(MARK):])
    if not report.get("importable"):
        return everyone(f"sglang is not importable by {python} ({report.get('why')}): the "
                        "command line was built but not checked by SGLang")
    version = report.get("version")
    return {name: _verdict(version, report["results"][name]) for name in jobs}


def _verdict(version: str | None, res: dict[str, Any]) -> Verdict:
    if not res["parsed"]:
        return Verdict(False, [f"SGLang {version} refuses the command line: {res['error']}"])
    launch, detail = res["launch"], " ".join(str(res["detail"] or "").split())[:400]
    if launch == "ok":
        return Verdict(True, [f"sglang {version}: command line parsed and passed SGLang's "
                              "launch-time checks"])
    if launch == "refused":
        return Verdict(False, [f"SGLang {version} would refuse this at launch: {detail}"])
    return Verdict(True, [f"sglang {version}: command line parsed; SGLang's launch-time checks "
                          f"not run here ({detail})"])


# --------------------------------------------------------------------------- serving a draft

SERVING_MARK = "OSPREY-SGLANG-DRAFT "
# Run by the condition's own interpreter and environment: does the SGLang there serve this
# EAGLE-3 draft as trained? Imports the draft class's module and reads it, loads no weight.
_SERVING = r"""
import base64, hashlib, importlib, importlib.metadata as md, inspect, json, re, sys, types
MARK = sys.argv[1]
job = json.load(sys.stdin)
try:
    import sglang
except Exception as exc:
    print(MARK + json.dumps({"importable": False, "why": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
out = {"importable": True, "version": getattr(sglang, "__version__", None)}
try:
    mod = importlib.import_module(job["module"])
except Exception as exc:
    out["module"] = False
    out["why"] = f"{type(exc).__name__}: {exc}"
    print(MARK + json.dumps(out))
    sys.exit(0)
out["module"] = True
cls = getattr(mod, job["architecture"], None)
out["registered"] = cls is not None and cls in list(getattr(mod, "EntryClass", None) or [])
path = inspect.getsourcefile(mod) or ""
raw = open(path, "rb").read() if path else b""
src = raw.decode("utf-8", "replace")
# As shipped: the file's sha256 is the one the installed distribution's RECORD lists.
out["as_shipped"] = None
try:
    files = md.files("sglang") or []
except md.PackageNotFoundError:
    files = []
for f in files:
    if f.hash is not None and str(f.locate()) == path:
        digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=")
        out["as_shipped"] = digest.decode() == f.hash.value
out["multi_layer"] = bool(re.search(r"range\([^)]*num_hidden_layers", src))
out["swap"] = "swap_h_and_emb" in src
out["embedding_kept"] = None
if cls is not None and job["owns_embedding"]:
    # What SGLang's EAGLE-3 worker does at load: set_embed(target embedding) on the draft.
    try:
        import torch
        own, target = (torch.nn.Parameter(torch.zeros(2, 2)) for _ in range(2))
        embed = torch.nn.Module()
        embed.weight = own
        stub = types.SimpleNamespace(config=types.SimpleNamespace(**job["config"]),
                                     model=types.SimpleNamespace(embed_tokens=embed))
        cls.set_embed(stub, target)
        out["embedding_kept"] = stub.model.embed_tokens.weight is own
    except Exception as exc:
        out["embedding_why"] = f"{type(exc).__name__}: {exc}"
print(MARK + json.dumps(out))
"""


@dataclass(frozen=True)
class Serving:
    """Whether the condition's SGLang serves its draft as trained: ``ok`` and why, in a line."""

    ok: bool
    detail: str


def serving_check(pilot: Pilot, name: str, layout: DraftLayout,
                  timeout_s: float = 300.0) -> Serving:  # fmt: skip
    """Ask the SGLang ``name`` would boot (``target.python``, with the condition's
    environment) whether it runs ``layout`` as trained: the draft class's module imports and
    registers it, builds every layer, keeps the draft's own embedding and honours
    ``swap_h_and_emb``. Boots nothing."""
    python = engine_python(pilot.target)
    cond = pilot.conditions[name]
    if layout.module is None:
        return Serving(True, f"SGLang's support for {layout.describe()} not checked: no "
                             "known module serves that class")
    config = {}
    if cond.drafter is not None:
        try:
            config = json.loads((Path(cond.drafter) / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            config = {}
    job = {"module": layout.module, "architecture": layout.architecture,
           "owns_embedding": layout.owns_embedding, "config": config}
    try:
        proc = subprocess.run(
            [python, "-c", _SERVING, SERVING_MARK], input=json.dumps(job),
            env=engine_environ(pilot.target.env, cond.env), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Serving(False, f"could not ask the SGLang at {python} about this draft: {exc}")
    found = [line for line in proc.stdout.splitlines() if line.startswith(SERVING_MARK)]
    if not found:
        tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return Serving(False, f"the SGLang at {python} gave no answer about this draft: {tail}")
    res = json.loads(found[-1][len(SERVING_MARK):])
    if not res.get("importable"):
        return Serving(True, f"not checked: sglang is not importable by {python} "
                             f"({res.get('why')})")
    version = res.get("version")
    osprey = layout.swap_h_and_emb or layout.architecture in PATCHED_EAGLE3
    patch = (f"the drafter's SGLang patch (written for SGLang {OSPREY_PATCH_SGLANG})"
             if osprey else "an SGLang patch that serves multi-layer EAGLE-3 drafts")
    remedy = (f"apply {patch} to the SGLang at {python} or serve it with an SGLang it was "
              "applied to (target.python, or PYTHONPATH in the condition's env)")
    stock = "stock SGLang" if res.get("as_shipped") is not False else "SGLang"
    if not res.get("module"):
        return Serving(False, f"{stock} {version} cannot import {layout.module} "
                              f"({res.get('why')}), so it has no class for this "
                              f"{layout.describe()}: {remedy}")
    if not res.get("registered"):
        return Serving(False, f"SGLang {version}'s {layout.module} registers no "
                              f"{layout.architecture} (EntryClass): {remedy}")
    single = layout.layers > 1 and not res.get("multi_layer")
    target_embed = layout.owns_embedding and res.get("embedding_kept") is False
    no_swap = layout.swap_h_and_emb and not res.get("swap")
    if single or target_embed or no_swap:
        runs = f"runs {'only layer 1 of ' if single else ''}this {layout.describe()}"
        runs += " with the target's embedding" if target_embed else ""
        runs += ", its input layer ignoring swap_h_and_emb" if no_swap else ""
        return Serving(False, f"{stock} {version} {runs}: {remedy}")
    origin = {True: "as shipped", False: "changed since install",
              None: "not a file the sglang distribution installed"}[res.get("as_shipped")]
    kept = ""
    if layout.owns_embedding:
        # A set_embed the stand-in cannot drive says nothing either way: the accept length will.
        kept = (", keeps the draft's embedding" if res.get("embedding_kept") else
                f", whether it keeps the draft's embedding not checked "
                f"({res.get('embedding_why')})")
    swap = ", honours swap_h_and_emb" if layout.swap_h_and_emb else ""
    line = (f"SGLang {version} serves this {layout.describe()}: {layout.module} imports "
            f"({origin}), builds every layer{kept}{swap}")
    if osprey and origin != "as shipped" and version and not str(version).startswith(
            OSPREY_PATCH_SGLANG):
        line += (f"; the patch was written for SGLang {OSPREY_PATCH_SGLANG}, this is "
                 f"{version}: compare the accept length with the release's")
    return Serving(True, line)
