"""Osprey and multi-layer EAGLE-3 drafts: their shape checked against the target, and whether
the SGLang a condition boots serves them as trained (its interpreter, its environment, no
boot). Drafter folders are built here from the shipped tiny target's config (random weights,
SGLang's tensor names and shapes); planted ``sglang`` packages stand in for a stock and a
patched engine, and the slow tests at the end ask the real SGLang 0.5.23
(OSPREY_SGLANG_PYTHON)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from pytest_osprey.judgement import GateResult, GateSpec
from pytest_osprey.judgement.cost.pricing import setup_cost
from pytest_osprey.judgement.figures.measured import Figures
from pytest_osprey.judgement.verdict.diagnosis import diagnose
from pytest_osprey.judgement.verdict.verdicts import verdicts
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.preflight.artifact import (
    DRAFT_LAYOUT,
    ArtifactReport,
    check_all,
    check_condition,
    draft_layout,
    sglang_draft,
)
from testkit.factories import ROOT, make_pilot

MODELS = Path(os.environ.get("OSPREY_TINY_MODELS") or ROOT / "fixtures" / "models")
TARGET = MODELS / "tiny-target"
EXAMPLE = ROOT / "examples" / "pilot-osprey-vs-eagle3.yaml"
REAL = os.environ.get("OSPREY_SGLANG_PYTHON")
LLAMA, QWEN3 = "LlamaForCausalLMEagle3", "Qwen3ForCausalLMEagle3"
DRAFT_VOCAB = 512

pytestmark = pytest.mark.skipif(not (TARGET / "config.json").is_file(),
                                reason=f"no tiny target under {MODELS}")


def draft(folder: Path, *, layers: int = 4, arch: str = LLAMA, osprey: bool = True,
          config: dict[str, Any] | None = None, weights_layers: int | None = None,
          embed_rows: int | None = None, embed: bool = True,
          maps: str = "consistent") -> Path:  # fmt: skip
    """An EAGLE-3 draft for the tiny target in SGLang's checkpoint layout: fc over three of
    the target's layers, ``layers.N`` decoder layers (layer 0 reads [embedding, hidden],
    twice as wide), a reduced vocabulary with d2t/t2d maps, and for an Osprey draft
    (``osprey``) ``swap_h_and_emb`` and its own embedding over the target's vocabulary."""
    t = json.loads((TARGET / "config.json").read_text())
    hidden, vocab, depth = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]
    heads, head_dim, inter = t["num_attention_heads"], t["head_dim"], t["intermediate_size"]
    cfg: dict[str, Any] = {
        "architectures": [arch], "model_type": "qwen3" if arch == QWEN3 else "llama",
        "hidden_size": hidden, "target_hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": t["num_key_value_heads"], "head_dim": head_dim,
        "rms_norm_eps": t["rms_norm_eps"], "vocab_size": vocab, "draft_vocab_size": DRAFT_VOCAB,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, depth // 2 - 1, depth - 4]},
    }  # fmt: skip
    if osprey:
        cfg["swap_h_and_emb"] = True
    cfg.update(config or {})
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    width = cfg["target_hidden_size"]
    tensors = {"fc.weight": w(hidden, 3 * width), "norm.weight": w(hidden),
               "lm_head.weight": w(DRAFT_VOCAB, hidden)}
    for i in range(layers if weights_layers is None else weights_layers):
        inp = 2 * hidden if i == 0 else hidden
        pre = f"layers.{i}."
        tensors.update({
            pre + "self_attn.q_proj.weight": w(heads * head_dim, inp),
            pre + "self_attn.k_proj.weight": w(heads * head_dim, inp),
            pre + "self_attn.v_proj.weight": w(heads * head_dim, inp),
            pre + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            pre + "mlp.gate_proj.weight": w(inter, hidden),
            pre + "mlp.up_proj.weight": w(inter, hidden),
            pre + "mlp.down_proj.weight": w(hidden, inter),
            pre + "input_layernorm.weight": w(hidden),
            pre + "post_attention_layernorm.weight": w(hidden),
            pre + "hidden_norm.weight": w(hidden),
        })  # fmt: skip
    if osprey and embed:
        tensors["embed_tokens.weight"] = w(embed_rows or vocab, hidden)
    keep = np.sort(rng.choice(vocab, DRAFT_VOCAB, replace=False))
    d2t = keep - np.arange(DRAFT_VOCAB)
    if maps == "duplicate":
        d2t[1] = keep[0] - 1  # draft ids 0 and 1 both map to target id keep[0]
    flags = np.zeros(vocab, dtype=np.bool_)
    flags[(keep + 1) % vocab if maps == "shifted" else keep] = True
    tensors.update({"d2t": d2t.astype(np.int64), "t2d": flags})
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def pilot(drafter: Path, *, python: str | None = sys.executable,
          env: dict[str, str] | None = None, cond_env: dict[str, str] | None = None,
          engine: str = "sglang", **sections: Any) -> Pilot:  # fmt: skip
    algorithm = "EAGLE3" if engine == "sglang" else "eagle3"
    return make_pilot(
        {"base": {"role": "baseline"},
         "osprey": {"role": "candidate", "drafter": str(drafter), "env": cond_env or {},
                    "speculation": {"algorithm": algorithm, "num_steps": 5, "eagle_topk": 1,
                                    "num_draft_tokens": 6}}},
        target={"engine": engine, "model": str(TARGET), "python": python, "env": env or {}},
        **sections,
    )  # fmt: skip


def failed(report: ArtifactReport) -> dict[str, str]:
    return {c.name: c.detail for c in report.failures()}


def detail(report: ArtifactReport, name: str) -> str:
    (found,) = [c for c in report.checks if c.name == name]
    assert found.ok, found
    return found.detail


# --------------------------------------------------------------------------- the draft's shape


@pytest.mark.parametrize(("arch", "layers"), [(LLAMA, 4), (QWEN3, 2)])
def test_an_osprey_draft_that_fits_the_target_passes_every_shape_check(
        tmp_path: Path, arch: str, layers: int) -> None:  # fmt: skip
    report = check_condition(pilot(draft(tmp_path / "d", layers=layers, arch=arch)), "osprey")
    assert report.ok, report.summary()
    assert detail(report, "draft layers") == f"{layers} decoder layer(s), all in the weights"
    assert detail(report, "embed_tokens") == ("embed_tokens.weight [8192, 256]: its own "
                                              "embedding over the target's vocabulary")
    assert detail(report, "swap_h_and_emb").startswith("true: the input layer reads [hidden")
    assert detail(report, "vocabulary maps") == "draft vocabulary 512 of 8192 (d2t, t2d)"
    assert detail(report, "aux layers") == (
        "target layers [1, 7, 12] of 16 (eagle_aux_hidden_state_layer_ids)")
    assert detail(report, "hidden size").endswith("target has 256")
    said = detail(report, "architecture")
    if arch == QWEN3:  # recognised, pointing at the patch: not "no class for it"
        assert "stock SGLang has no class for" in said
        assert "module sglang.srt.models.qwen3_eagle3" in said


OSPREY = MODELS / "tiny-osprey"
shipped_osprey = pytest.mark.skipif(not (OSPREY / "config.json").is_file(),
                                    reason=f"no tiny-osprey under {MODELS}")


@shipped_osprey
def test_the_shipped_osprey_style_draft_passes_every_shape_check() -> None:
    """The trained tiny-osprey (2 layers, 128 wide, its own embedding, swap_h_and_emb) reads
    the 256-wide tiny target: every check of its shape passes, and its layout asks for the
    drafter's SGLang patch."""
    report = check_condition(pilot(OSPREY), "osprey")
    assert report.ok, report.summary()
    assert detail(report, "draft layers") == "2 decoder layer(s), all in the weights"
    assert detail(report, "embed_tokens") == ("embed_tokens.weight [8192, 128]: its own "
                                              "embedding over the target's vocabulary")
    assert detail(report, "hidden size").startswith("drafter expects target hidden size 256")
    layout = draft_layout(json.loads((OSPREY / "config.json").read_text()))
    assert layout is not None and layout.needs_patch and layout.owns_embedding
    assert layout.describe() == "2-layer Osprey draft (LlamaForCausalLMEagle3)"


def test_a_multi_layer_eagle3_draft_without_osprey_marks_needs_no_own_embedding(
        tmp_path: Path) -> None:  # fmt: skip
    report = check_condition(pilot(draft(tmp_path / "d", layers=3, osprey=False)), "osprey")
    assert report.ok, report.summary()
    names = {c.name for c in report.checks}
    assert "draft layers" in names and not names & {"embed_tokens", "swap_h_and_emb"}


@pytest.mark.parametrize(
    ("kwargs", "check", "says"),
    [
        ({"weights_layers": 2}, "draft layers",
         "num_hidden_layers 4, but the weights hold layers [0, 1]: a partial checkpoint or a "
         "wrong config; download the checkpoint whole or set num_hidden_layers to match"),
        ({"config": {"num_hidden_layers": 0}}, "draft layers",
         "num_hidden_layers 0: expected the draft's decoder layer count (the weights hold "
         "layers [0, 1, 2, 3])"),
        ({"embed": False}, "embed_tokens",
         "swap_h_and_emb drafts carry their own embedding, but the weights hold no "
         "embed_tokens.weight: download the checkpoint whole"),
        ({"embed_rows": 4096}, "embed_tokens",
         "embed_tokens.weight has shape [4096, 256], expected [8192, 256] (target vocab_size, "
         "draft hidden_size): its inputs are the target's token ids"),
        ({"config": {"swap_h_and_emb": "yes"}}, "swap_h_and_emb",
         "swap_h_and_emb 'yes': expected true or false in config.json"),
        ({"config": {"target_hidden_size": 512}}, "hidden size",
         "drafter expects target hidden size 512 (its fc reads 3 target layers of that width), "
         "target has 256: its target_hidden_size is another target's; use a draft trained on "
         "this target's hidden states"),
        ({"config": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 7, 15]}}},
         "aux layers", "[15] outside the target's 16 layers"),
        ({"maps": "shifted"}, "vocabulary maps",
         "t2d flags 512 target ids, d2t maps to 512, "),
        ({"maps": "duplicate"}, "vocabulary maps",
         "d2t maps 1 draft ids onto target ids another draft id already has: re-export d2t/t2d"),
    ],
)
def test_each_misfit_fails_one_check_naming_the_field_and_the_fix(
        tmp_path: Path, kwargs: dict[str, Any], check: str, says: str) -> None:  # fmt: skip
    report = check_condition(pilot(draft(tmp_path / "d", **kwargs)), "osprey")
    assert set(failed(report)) == {check}, report.summary()
    assert says in failed(report)[check]


def test_which_drafts_stock_sglang_cannot_serve(tmp_path: Path) -> None:
    osprey = draft_layout(json.loads(
        (draft(tmp_path / "o", layers=2, arch=QWEN3) / "config.json").read_text()))
    assert osprey is not None and osprey.needs_patch and osprey.owns_embedding
    assert osprey.describe() == "2-layer Osprey draft (Qwen3ForCausalLMEagle3)"
    assert osprey.module == "sglang.srt.models.qwen3_eagle3"
    single = draft_layout(json.loads((MODELS / "tiny-eagle3" / "config.json").read_text()))
    assert single is not None and not single.needs_patch
    assert draft_layout({"architectures": ["LlamaForCausalLM"]}) is None
    four = draft(tmp_path / "f")
    assert sglang_draft(pilot(four), "osprey") is not None
    assert sglang_draft(pilot(four), "base") is None
    assert sglang_draft(pilot(four, engine="vllm"), "osprey") is None
    assert sglang_draft(pilot(MODELS / "tiny-eagle3"), "osprey") is None


# --------------------------------------------------------------------------- the serving SGLang


def plant(root: Path, version: str, modules: dict[str, str]) -> Path:
    """An ``sglang`` package at ``root`` with the given model modules (name -> source)."""
    pkg = root / "sglang"
    (pkg / "srt" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "models" / "__init__.py").write_text("")
    for name, source in modules.items():
        (pkg / "srt" / "models" / f"{name}.py").write_text(source)
    return root


# An engine that builds one midlayer and shares the target's embedding (as SGLang's EAGLE-3
# worker does through set_embed), and one whose added module builds every layer, honours
# swap_h_and_emb and keeps a draft's own embedding.
SINGLE_LAYER = '''
class LlamaForCausalLMEagle3:
    def __init__(self, config):
        self.midlayer = object()

    def set_embed(self, embed):
        self.model.embed_tokens.weight = embed


EntryClass = [LlamaForCausalLMEagle3]
'''
PATCHED = '''
class Qwen3ForCausalLMEagle3:
    def __init__(self, config):
        self.layers = [object() for _ in range(config.num_hidden_layers)]
        self.swap = config.swap_h_and_emb

    def set_embed(self, embed):
        if getattr(self.config, "swap_h_and_emb", False):
            return  # the draft's own, tokenizer-aligned embedding stays
        self.model.embed_tokens.weight = embed


EntryClass = [Qwen3ForCausalLMEagle3]
'''


def serving(report: ArtifactReport) -> tuple[bool, str]:
    (found,) = [c for c in report.checks if c.name == "serving engine"]
    return found.ok, found.detail


@pytest.mark.slow  # over a second on 2 busy cores
def test_an_engine_that_runs_one_layer_with_the_targets_embedding_fails_the_gate(
        tmp_path: Path) -> None:  # fmt: skip
    engine = plant(tmp_path / "engine", "0.5.9", {"llama_eagle3": SINGLE_LAYER})
    drafter = draft(tmp_path / "d", layers=2)
    reports = check_all(pilot(drafter, env={"PYTHONPATH": str(engine)}), ["base", "osprey"])
    assert reports["base"].ok and not reports["osprey"].ok
    # The draft's description is kept as data beside the checks (the diagnosis reads it).
    assert [c.detail for c in reports["osprey"].checks if c.name == DRAFT_LAYOUT] == [
        "2-layer Osprey draft (LlamaForCausalLMEagle3)"]
    ok, said = serving(reports["osprey"])
    assert not ok
    assert said.startswith(
        "stock SGLang 0.5.9 runs only layer 1 of this 2-layer Osprey draft "
        "(LlamaForCausalLMEagle3) with the target's embedding, its input layer ignoring "
        "swap_h_and_emb: apply the drafter's SGLang patch (written for SGLang 0.5.9) to the "
        f"SGLang at {sys.executable} or serve it with an SGLang it was applied to"), said


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_patched_module_in_the_conditions_own_environment_passes(tmp_path: Path) -> None:
    """The condition's env (here its PYTHONPATH) decides which SGLang is asked, as at boot."""
    stock = plant(tmp_path / "stock", "0.5.23", {"llama_eagle3": SINGLE_LAYER})
    patched = plant(tmp_path / "patched", "0.5.9", {"qwen3_eagle3": PATCHED})
    drafter = draft(tmp_path / "d", layers=2, arch=QWEN3)
    refused = check_all(pilot(drafter, env={"PYTHONPATH": str(stock)}), ["osprey"])["osprey"]
    ok, said = serving(refused)
    assert not ok and said.startswith(
        "stock SGLang 0.5.23 cannot import sglang.srt.models.qwen3_eagle3 "
        "(ModuleNotFoundError: No module named 'sglang.srt.models.qwen3_eagle3'), so it has no "
        "class for this 2-layer Osprey draft (Qwen3ForCausalLMEagle3): apply the drafter's "
        "SGLang patch"), said
    accepted = check_all(pilot(drafter, env={"PYTHONPATH": str(stock)},
                               cond_env={"PYTHONPATH": str(patched)}), ["osprey"])["osprey"]
    assert accepted.ok, accepted.summary()
    ok, said = serving(accepted)
    assert said == (
        "SGLang 0.5.9 serves this 2-layer Osprey draft (Qwen3ForCausalLMEagle3): "
        "sglang.srt.models.qwen3_eagle3 imports (not a file the sglang distribution "
        "installed), builds every layer, keeps the draft's embedding, honours swap_h_and_emb")


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_patch_on_another_sglang_than_it_was_written_for_is_said(tmp_path: Path) -> None:
    patched = plant(tmp_path / "patched", "0.5.23", {"qwen3_eagle3": PATCHED})
    drafter = draft(tmp_path / "d", layers=2, arch=QWEN3)
    report = check_all(pilot(drafter, env={"PYTHONPATH": str(patched)}), ["osprey"])["osprey"]
    ok, said = serving(report)
    assert ok and said.endswith("; the patch was written for SGLang 0.5.9, this is 0.5.23: "
                                "compare the accept length with the release's"), said


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_set_embed_the_probe_cannot_drive_is_said_not_checked(tmp_path: Path) -> None:
    """A patched class whose set_embed needs more of the model than the stand-in has: the
    embedding is not judged either way (the accept length will tell), the rest is."""
    needy = PATCHED.replace("    def set_embed(self, embed):\n",
                            "    def set_embed(self, embed):\n        self.pp_group.rank\n")
    patched = plant(tmp_path / "patched", "0.5.9", {"qwen3_eagle3": needy})
    drafter = draft(tmp_path / "d", layers=2, arch=QWEN3)
    report = check_all(pilot(drafter, env={"PYTHONPATH": str(patched)}), ["osprey"])["osprey"]
    ok, said = serving(report)
    assert ok and ("builds every layer, whether it keeps the draft's embedding not checked "
                   "(AttributeError: ") in said and said.endswith("honours swap_h_and_emb"), said


def test_without_sglang_the_serving_check_says_it_did_not_run(tmp_path: Path) -> None:
    report = check_all(pilot(draft(tmp_path / "d")), ["osprey"])["osprey"]
    ok, said = serving(report)
    assert ok and said.startswith(f"not checked: sglang is not importable by {sys.executable}")


def test_single_layer_eagle3_drafts_ask_no_engine(tmp_path: Path) -> None:
    report = check_all(pilot(MODELS / "tiny-eagle3", python="/nonexistent/python"), ["osprey"])
    assert report["osprey"].ok, report["osprey"].summary()
    assert "serving engine" not in {c.name for c in report["osprey"].checks}


# --------------------------------------------------------------------------- diagnosis


def _diagnosis(p: Pilot, accept: float) -> str | None:
    spec = GateSpec("speedup", "osprey", reference="base", load="concurrent", gating=True)
    gate = GateResult(spec, "fail", "slower", estimate=0.7, ci_low=0.65, ci_high=0.75,
                      threshold=1.0)
    # The artifact gate as preflight records it (check_all's draft layout line): what the
    # diagnosis knows of the draft.
    layout = sglang_draft(p, "osprey")
    lines = [{"name": DRAFT_LAYOUT, "ok": True, "detail": layout.describe()}] if layout else []
    artifact = GateResult(GateSpec("artifact", "osprey"), "pass", "fits",
                          details={"condition": "osprey", "checks": lines})
    figs = [Figures(condition=c, load="concurrent", concurrency=8, ok=21, total=21,
                    ttft_p50_s=0.1, ttft_p95_s=0.2, e2e_p50_s=1.0, e2e_p95_s=2.0,
                    tpot_p50_s=0.02, tokens_per_s=40.0, request_tokens_per_s_p50=40.0,
                    accept_length_pooled=accept if c == "osprey" else None,
                    accept_length_mean=accept if c == "osprey" else None, peak_memory_mb=1.0,
                    load_label="x8") for c in ("base", "osprey")]
    (verdict,) = verdicts(p, [gate])
    (reason,) = diagnose(p, verdict, [gate, artifact], figs).reasons
    return reason.diagnosis


def test_accept_length_near_one_on_an_osprey_draft_names_an_unpatched_sglang(
        tmp_path: Path) -> None:  # fmt: skip
    load = {"levels": {"concurrent": 8}}
    said = _diagnosis(pilot(draft(tmp_path / "d"), load=load), 1.02)
    assert said is not None and "most likely an SGLang without the drafter's patch, running " \
        "this 4-layer Osprey draft (LlamaForCausalLMEagle3) with the target's embedding" in said
    plain = pilot(MODELS / "tiny-eagle3", load=load)
    said = _diagnosis(plain, 1.02)
    assert said is not None and "vocabulary/tokenizer mismatch" in said and "patch" not in said


# --------------------------------------------------------------------------- the shipped example


def test_the_osprey_example_is_the_papers_serving_config_against_the_current_eagle3(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("OSPREY_SGLANG_PYTHON", sys.executable)
    p = load_pilot(EXAMPLE, absent_drafters=True)  # a GPU deployment: they are not here
    assert p.current == "eagle3" and p.candidates == ["osprey"]
    assert p.references("osprey") == ["baseline", "eagle3"]
    for name in ("eagle3", "osprey"):
        spec = p.conditions[name].speculation
        assert spec is not None and spec.algorithm == "EAGLE3"
        assert (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == (5, 1, 6)
    assert p.decision.gate_unusual_slice  # speed against EAGLE-3 on the unusual slice decides
    assert p.limits.cost.max_break_even_days is not None
    assert setup_cost(p, "osprey") == 24 * p.cost.device_hour_price  # device-hours x price
    assert setup_cost(p, "eagle3") == 0  # it serves today
    assert p.cost.expected_requests_per_day
    # Timed at a serving temperature, so the distribution check runs by default.
    assert p.sampling.serving.temperature > 0 and p.sampling.sampled.enabled


real = pytest.mark.skipif(not REAL, reason="set OSPREY_SGLANG_PYTHON (a real SGLang 0.5.23)")


@pytest.mark.engine
@real
def test_real_stock_sglang_refuses_osprey_drafts_and_serves_a_single_layer_eagle3(
        tmp_path: Path) -> None:  # fmt: skip
    assert REAL is not None
    qwen = draft(tmp_path / "qwen", layers=2, arch=QWEN3)
    llama = draft(tmp_path / "llama", layers=4)
    p = make_pilot(
        {"base": {"role": "baseline"},
         **{name: {"role": "candidate", "drafter": str(folder),
                   "speculation": {"algorithm": "EAGLE3", "num_steps": 5, "eagle_topk": 1,
                                   "num_draft_tokens": 6}}
            for name, folder in (("qwen", qwen), ("llama", llama),
                                 ("eagle3", MODELS / "tiny-eagle3"), ("trained", OSPREY))}},
        target={"engine": "sglang", "model": str(TARGET), "python": REAL},
    )  # fmt: skip
    reports = check_all(p, ["base", "qwen", "llama", "eagle3", "trained"])
    assert reports["eagle3"].ok, reports["eagle3"].summary()
    assert set(failed(reports["qwen"])) == {"serving engine"}
    assert failed(reports["qwen"])["serving engine"].startswith(
        "stock SGLang 0.5.23 cannot import sglang.srt.models.qwen3_eagle3 (ModuleNotFoundError")
    # 0.5.23 builds all 4 layers, but replaces the draft's embedding and reads
    # [embedding, hidden] whatever swap_h_and_emb says.
    assert failed(reports["llama"]) == {"serving engine": (
        "stock SGLang 0.5.23 runs this 4-layer Osprey draft (LlamaForCausalLMEagle3) with the "
        "target's embedding, its input layer ignoring swap_h_and_emb: apply the drafter's "
        f"SGLang patch (written for SGLang 0.5.9) to the SGLang at {REAL} or serve it with an "
        "SGLang it was applied to (target.python, or PYTHONPATH in the condition's env)")}
    # The trained Osprey-style draft (tiny-osprey) is refused too. It is 128 wide against the
    # target's 256, and SGLang shares the target's embedding only across equal widths, so its
    # own embedding is kept: what stock SGLang gets wrong for it is the input order alone.
    assert set(failed(reports["trained"])) == {"serving engine"}
    assert failed(reports["trained"])["serving engine"].startswith(
        "stock SGLang 0.5.23 runs this 2-layer Osprey draft (LlamaForCausalLMEagle3), its input "
        "layer ignoring swap_h_and_emb: apply the drafter's SGLang patch (written for SGLang "
        "0.5.9)")
    from pytest_osprey.engines.sglang.check import serving_check

    single = draft_layout(json.loads((MODELS / "tiny-eagle3" / "config.json").read_text()))
    assert single is not None
    said = serving_check(p, "eagle3", single)
    assert said.ok and said.detail == (
        "SGLang 0.5.23 serves this 1-layer EAGLE-3 draft (LlamaForCausalLMEagle3): "
        "sglang.srt.models.llama_eagle3 imports (as shipped), builds every layer"), said


@pytest.mark.engine
@real
def test_the_osprey_example_passes_the_dry_run(pytester: pytest.Pytester) -> None:
    """Its command lines pass SGLang's own checks here; the drafter folders are not on this
    machine, which each artifact check says."""
    result = pytester.runpytest_subprocess(
        f"--osprey-config={EXAMPLE}", "--osprey-dry-run", "-p", "no:cacheprovider", "-rA",
        timeout=600,
    )
    out = result.stdout.str()
    result.assert_outcomes(passed=3, failed=2)  # three command lines; two absent drafters
    assert out.count("sglang 0.5.23: command line parsed") == 3, out
    assert "/models/osprey-layerskip-llama3.1-8b: no such folder on this machine" in out
    assert "--speculative-num-steps 5 --speculative-eagle-topk 1 " \
        "--speculative-num-draft-tokens 6" in out and "refuse" not in out
