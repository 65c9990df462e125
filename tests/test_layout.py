"""The package's shape, checked from the source (ast): no import cycles (type-only ones
included), judgement pure, engines free of pytest, saved results below judgement, a free entry
point, no private name imported across modules, modules of a reviewable size, and the test
support package below both tests and benchmarks."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "pytest_osprey"
MAX_LINES = 500
# Modules kept whole past MAX_LINES because they hold one concern; each says why. The cap is a
# prompt for review, not a reason to cut a concern in two: a new entry needs its reason.
LONG_MODULES: dict[str, str] = {
    "pytest_osprey.campaign.runner": "one campaign's measuring loop and the campaign.json facts "
                                     "it keeps as it goes",
    "pytest_osprey.pilot.trace": "the trace: reading, validating, selecting, hashing and "
                                 "rendering prompts",
    "pytest_osprey.report.html": "the report page: its sections and the escaping primitives "
                                 "only it uses",
}

# layer -> in-package layers and outside packages it must never reach, even indirectly.
FORBIDDEN: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pytest_osprey.pilot": (
        ("results", "judgement", "campaign", "engines", "preflight", "report", "run",
         "pytest_adapter", "plugin"), ("pytest", "_pytest", "numpy", "scipy", "torch")),
    "pytest_osprey.results": (
        ("judgement", "campaign", "engines", "preflight", "report", "run", "pytest_adapter",
         "plugin"), ("pytest", "_pytest", "scipy", "torch")),
    "pytest_osprey.judgement": (
        ("campaign", "engines", "preflight", "report", "run", "pytest_adapter", "plugin"),
        ("pytest", "_pytest", "torch", "transformers", "httpx", "matplotlib")),
    "pytest_osprey.engines": (
        ("judgement", "campaign", "preflight", "report", "run", "pytest_adapter", "plugin"),
        ("pytest", "_pytest")),
    "pytest_osprey.campaign": (
        ("judgement", "preflight", "report", "run", "pytest_adapter", "plugin"),
        ("pytest", "_pytest")),
    "pytest_osprey.preflight": (
        ("judgement", "campaign", "report", "run", "pytest_adapter", "plugin"),
        ("pytest", "_pytest")),
    "pytest_osprey.report": (
        ("campaign", "engines", "preflight", "run", "pytest_adapter", "plugin"),
        ("pytest", "_pytest", "torch", "transformers")),
    # The Kubernetes launcher writes what other machinery runs: the pilot file is all it reads.
    "pytest_osprey.shards.k8s": (
        ("results", "judgement", "campaign", "engines", "preflight", "report", "run",
         "pytest_adapter", "plugin"), ("pytest", "_pytest", "numpy", "torch", "kubernetes")),
    # A run may be one shard of a plan (shards.plan); merging and launching shards sit above it.
    "pytest_osprey.run": (("shards.merge", "shards.ray", "shards.k8s", "pytest_adapter", "plugin"),
                          ("pytest", "_pytest")),
    "pytest_osprey.shards": (("pytest_adapter", "plugin"), ("pytest", "_pytest")),
    "pytest_osprey.__main__": (("pytest_adapter", "plugin"), ("pytest", "_pytest")),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.Module, top_level_only: bool = False,
                     type_only: bool = False) -> Iterator[ast.stmt]:
    """Import statements that run (not under ``if TYPE_CHECKING``), or with ``type_only``
    every import statement, those under ``if TYPE_CHECKING`` too."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                         | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_pkg = MODULES[module].name == "__init__.py"
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, top_level_only: bool = False,
               type_only: bool = False) -> tuple[set[str], set[str]]:
    """(in-package modules, outside top-level packages) that ``module`` imports at run time
    (with ``type_only``: for type checking too)."""
    tree = ast.parse(MODULES[module].read_text("utf-8"))
    inside: set[str] = set()
    outside: set[str] = set()
    for node in _runtime_imports(tree, top_level_only, type_only):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            target = _resolve(module, node)
            if target == "__future__":
                continue
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                     for a in node.names]
        for name in names:
            if name.split(".")[0] == "pytest_osprey":
                while name not in MODULES:  # `import pytest_osprey.x.y` style
                    name = name.rsplit(".", 1)[0]
                inside.add(name)
            else:
                outside.add(name.split(".")[0])
    inside.discard(module)
    return inside, outside


def graph(type_only: bool = False) -> dict[str, set[str]]:
    return {m: imports_of(m, type_only=type_only)[0] for m in MODULES}


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def reach(start: str, edges: dict[str, set[str]]) -> set[str]:
    """Every module importing ``start`` runs, parent packages' __init__ included."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += [n for n in edges[m] | _parents(m) if n in MODULES]
    return seen


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    assert not _cycles(graph()), f"import cycles: {_cycles(graph())}"


@pytest.mark.slow  # over a second on 2 busy cores
def test_no_type_only_import_cycles() -> None:
    """A cycle hidden under ``if TYPE_CHECKING`` is still two modules that need each other."""
    cycles = _cycles(graph(type_only=True))
    assert not cycles, f"import cycles (type-only imports included): {cycles}"


def _private_imports(path: Path, module: str | None) -> Iterator[str]:
    """``from X import _name`` lines: a private name used outside the module that owns it."""
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        target = _resolve(module, node) if module is not None else (node.module or "")
        if target.split(".")[0] != "pytest_osprey" and module is not None:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                yield f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from {target}"


def test_no_private_name_is_imported_across_modules() -> None:
    problems = [line for m, p in MODULES.items() for line in _private_imports(p, m)]
    assert not problems, "private names imported across modules (make them public where " \
        "they live):\n" + "\n".join(problems)


def test_tests_and_benchmarks_use_no_private_name_of_the_package() -> None:
    problems = []
    for folder in ("tests", "benchmarks", "testkit", "suites"):
        for path in (ROOT / folder).rglob("*.py"):
            problems += [line for line in _private_imports(path, None)
                         if " from pytest_osprey" in line]
    assert not problems, "\n".join(problems)


def _top_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def _local_modules(folder: Path) -> set[str]:
    """Names a script in ``folder``, or in a folder below it, could import by being beside
    it (tests/ keeps its test files in folders that mirror the package)."""
    return {p.stem for p in folder.rglob("*.py")} | {
        p.name for p in folder.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_test_support_package_sits_below_tests_and_benchmarks() -> None:
    """tests/ and benchmarks/ share testkit/ and never import each other; testkit imports
    neither."""
    tests, benches, kit = ROOT / "tests", ROOT / "benchmarks", ROOT / "testkit"
    assert (kit / "__init__.py").is_file(), "testkit/ is the shared test-support package"
    from_tests = _local_modules(tests) - _local_modules(benches)
    from_benches = _local_modules(benches) - _local_modules(tests)
    problems = []
    for path in kit.rglob("*.py"):
        bad = _top_imports(path) & ({"tests", "benchmarks"} | from_tests | from_benches)
        problems += [f"{path.relative_to(ROOT)} imports {sorted(bad)}"] if bad else []
    for path in tests.rglob("*.py"):
        # a test module is no library either: what two test files share belongs in testkit
        bad = _top_imports(path) & ({"benchmarks", "tests"} | from_benches
                                    | {m for m in from_tests if m.startswith("test_")})
        problems += [f"{path.relative_to(ROOT)} imports {sorted(bad)}"] if bad else []
    for path in benches.rglob("*.py"):
        bad = _top_imports(path) & ({"tests"} | from_tests)
        problems += [f"{path.relative_to(ROOT)} imports {sorted(bad)}"] if bad else []
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_rules(layer: str) -> None:
    banned_inside, banned_outside = FORBIDDEN[layer]
    edges = graph()
    members = [m for m in MODULES if m == layer or m.startswith(layer + ".")]
    assert members, layer
    problems = []
    for member in members:
        for m in reach(member, edges):
            rel = m.removeprefix("pytest_osprey.")
            if any(rel == b or rel.startswith(b + ".") for b in banned_inside):
                problems.append(f"{member} reaches {m}")
            bad = imports_of(m)[1] & set(banned_outside)
            if bad:
                problems.append(f"{member} reaches {m}, which imports {', '.join(sorted(bad))}")
    assert not problems, "\n".join(sorted(set(problems)))


@pytest.mark.slow  # over a second on 2 busy cores
def test_only_the_adapters_import_pytest() -> None:
    users = {m for m in MODULES if imports_of(m)[1] & {"pytest", "_pytest"}}
    assert users <= {"pytest_osprey.plugin", "pytest_osprey.pytest_adapter"}, users


def test_the_entry_point_imports_nothing_at_module_level() -> None:
    inside, outside = imports_of("pytest_osprey.plugin", top_level_only=True)
    assert inside == set(), inside
    assert outside <= {"pathlib", "typing"}, outside
    init_inside, init_outside = imports_of("pytest_osprey", top_level_only=True)
    assert init_inside == set() and init_outside <= {"importlib", "typing"}, init_outside


def test_importing_the_entry_point_loads_no_heavy_library() -> None:
    code = ("import sys, pytest_osprey.plugin; "
            "print(','.join(sorted(m for m in ('numpy', 'scipy', 'torch', 'transformers', "
            "'matplotlib', 'pydantic', 'yaml', 'pytest', 'httpx') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"imported at entry: {out.stdout.strip()}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_reviewable(module: str) -> None:
    lines = len(MODULES[module].read_text("utf-8").splitlines())
    if module in LONG_MODULES:
        return
    assert lines <= MAX_LINES, (
        f"{MODULES[module]}: {lines} lines: split it where it holds more than one concern, or "
        "list it in LONG_MODULES with the reason it is one")


def test_every_package_is_installed() -> None:
    """pyproject lists packages by hand: a subpackage left out is missing from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]
                 ["setuptools"]["packages"])
    found = {module_name(p.parent / "__init__.py") for p in PKG.rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {found - listed}"


def test_long_modules_are_still_long() -> None:
    """An allowance nobody needs any more is removed, so the list stays a list of reasons."""
    stale = [m for m in LONG_MODULES
             if m not in MODULES or len(MODULES[m].read_text("utf-8").splitlines()) <= MAX_LINES]
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): {stale}"


# What judging computes, assembled once by judge(): a reader (report, adapters, entry points)
# that called one of these would finish the judgement itself, and could drift from it.
EVALUATORS = frozenset({
    "judge", "evaluate", "verdicts", "diagnose", "diagnose_all", "stability", "cost_summary",
    "goodput_section", "all_domain_rows", "held_out_overlaps", "machine_speedups",
    "per_position_acceptance", "speedup_cells", "with_speedups", "all_figures", "figures_for",
})
# Who may call judge() and evaluate() (a preflight gate before anything boots): the run.
JUDGING = ("pytest_osprey.run.pilot_run", "pytest_osprey.judgement")


def _judgement_names(module: str) -> set[str]:
    """The names ``module`` imports from the judgement package (type-only imports too)."""
    tree = ast.parse(MODULES[module].read_text("utf-8"))
    names: set[str] = set()
    for node in _runtime_imports(tree, type_only=True):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target == "pytest_osprey.judgement" or target.startswith(
                    "pytest_osprey.judgement."):
                names |= {a.name for a in node.names}
    return names


def test_the_judgement_is_finished_in_one_place() -> None:
    """Only the judgement package (and the run, which calls judge) imports an evaluator:
    reports, merge and the entry points read the typed judgement judge() returns."""
    problems = []
    for module in MODULES:
        if module.startswith(JUDGING):
            continue
        bad = _judgement_names(module) & EVALUATORS
        if bad:
            problems.append(f"{module} imports {', '.join(sorted(bad))}")
    assert not problems, "\n".join(problems)


def test_reports_import_no_judgement_evaluator() -> None:
    """report/ formats what it is given: an evaluator imported there would compute."""
    reports = [m for m in MODULES if m.startswith("pytest_osprey.report.")]
    assert reports
    for module in reports:
        assert not _judgement_names(module) & EVALUATORS, module


# What pilot files name in target.engine (pilot/schema.py), and what engines/ calls its kinds.
ENGINE_NAMES = frozenset({"transformers", "sglang", "vllm", "endpoint", "embedded"})
# Modules that may still compare engine names, each with its reason. A layer engines/ sits
# above cannot ask a kind (engines/kinds.py): it reads the pilot's own field.
ENGINE_NAME_BRANCHES: dict[str, str] = {}


def _below_engines(module: str) -> bool:
    rel = module.removeprefix("pytest_osprey.")
    return any((rel == layer.removeprefix("pytest_osprey.")
                or rel.startswith(layer.removeprefix("pytest_osprey.") + "."))
               and "engines" in banned for layer, (banned, _) in FORBIDDEN.items())


def _engine_names(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & ENGINE_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {n for e in node.elts for n in _engine_names(e)}
    return set()


def _names_an_engine(node: ast.expr) -> bool:
    """An expression reading an engine field (``target.engine``, ``engine``, ``["engine"]``)."""
    return any((isinstance(n, ast.Name) and "engine" in n.id.lower())
               or (isinstance(n, ast.Attribute) and "engine" in n.attr.lower())
               or (isinstance(n, ast.Constant) and n.value == "engine") for n in ast.walk(node))


def _branches(tree: ast.AST) -> Iterator[ast.Compare]:
    """``engine == "sglang"`` and the like (==, !=, in, not in)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not any(
                isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            continue
        sides = [node.left, *node.comparators]
        if any(_engine_names(s) for s in sides) and any(
                _names_an_engine(s) for s in sides if not _engine_names(s)):
            yield node


def engine_name_branches(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text("utf-8"))
    return [f"{MODULES[module].relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)}"
            for n in _branches(tree)]


def test_engine_names_are_branched_on_only_inside_engines() -> None:
    """What an engine kind can do is asked of its kind (engines/kinds.py); a branch on the
    name elsewhere is engine knowledge that left engines/."""
    problems = [line for m in MODULES
                if not m.startswith("pytest_osprey.engines") and not _below_engines(m)
                and m not in ENGINE_NAME_BRANCHES for line in engine_name_branches(m)]
    assert not problems, "ask the engine kind instead:\n" + "\n".join(problems)


def test_engine_name_allowances_are_still_needed() -> None:
    stale = [m for m in ENGINE_NAME_BRANCHES if m not in MODULES or not engine_name_branches(m)]
    assert not stale, f"no engine-name branch left (or gone): {stale}"


def test_the_engine_name_rule_sees_a_branch() -> None:
    tree = ast.parse('if pilot.target.engine == "sglang" or engine in ("vllm", "x"): pass\n'
                     'if cond.endpoint.protocol == "sglang": pass')
    assert sorted(ast.unparse(n) for n in _branches(tree)) == [
        "engine in ('vllm', 'x')", "pilot.target.engine == 'sglang'"]
