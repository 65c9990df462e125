"""Artifact check on fake checkpoints: does a drafter fit its target and engine, before a boot?"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.preflight.artifact import (
    ArtifactReport,
    Check,
    check_all,
    check_condition,
    family,
    safetensors_header,
)
from testkit.factories import ROOT, make_pilot

VOCAB = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "d": 5, "e": 6, "f": 7}


def fake_model(
    folder: Path,
    arch: str = "LlamaForCausalLM",
    *,
    vocab_size: int = 8,
    hidden_size: int = 16,
    vocab: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
    weights: bool = True,
    license_file: str | None = None,
) -> Path:
    """A checkpoint folder: config.json, tokenizer.json and a valid safetensors file."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [arch], "vocab_size": vocab_size, "hidden_size": hidden_size}
    config.update(extra or {})
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab or VOCAB}}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    if weights:
        tensors = {
            "embed.weight": np.zeros((vocab_size, hidden_size), dtype=np.float32),
            "norm.weight": np.ones((hidden_size,), dtype=np.float32),
        }
        save_file(tensors, str(folder / "model.safetensors"))
    if license_file:
        (folder / license_file).write_text("Apache-2.0\n", encoding="utf-8")
    return folder


def pilot_for(
    tmp_path: Path,
    drafter: Path | None,
    *,
    engine: str = "transformers",
    algorithm: str | None = None,
    pins: dict[str, Any] | None = None,
    target: Path | str | None = None,
) -> Pilot:
    """A Pilot built directly with the pydantic models: baseline + one candidate 'cand'."""
    if target is None:
        target = tmp_path / "target"
        if not target.exists():
            fake_model(target)
    speculation = {"algorithm": algorithm} if algorithm else {}
    cand: dict[str, Any] = {"role": "candidate", "speculation": speculation, "pins": pins or {}}
    if drafter is not None:
        cand["drafter"] = str(drafter)
    return make_pilot(
        target={"engine": engine, "model": str(target)},
        conditions={"base": {"role": "baseline"}, "cand": cand},
        trace={"files": [str(tmp_path / "trace.jsonl")]},
    )


def failed(report: ArtifactReport) -> dict[str, str]:
    return {c.name: c.detail for c in report.failures()}


def named(report: ArtifactReport, name: str) -> Check:
    found = [c for c in report.checks if c.name == name]
    assert len(found) == 1, report.checks
    return found[0]


# --------------------------------------------------------------------------- fitting drafters


def test_plain_drafter_for_transformers_assisted_passes(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", hidden_size=8)  # a smaller model: fine when plain
    report = check_condition(pilot_for(tmp_path, drafter, algorithm="assisted"), "cand")
    assert report.ok, report.summary()
    names = {c.name for c in report.checks}
    assert {"architecture", "vocabulary", "tokenizer", "weights"} <= names
    assert "hidden size" not in names  # only EAGLE drafters read the target's hidden states
    assert report.summary() == f"cand: artifact fits ({len(report.checks)} checks)"
    assert named(report, "weights").detail == "model.safetensors: 2 tensors"


def test_tensor_count_ignores_metadata(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", weights=False)
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(drafter / "model.safetensors"),
              metadata={"format": "pt"})
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert named(report, "weights").detail == "model.safetensors: 1 tensors"


def test_default_algorithm_is_the_engines_draft_model_method(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    for engine in ("transformers", "sglang", "vllm"):
        assert check_condition(pilot_for(tmp_path, drafter, engine=engine), "cand").ok


def test_eagle3_drafter_for_sglang_eagle3_passes(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle3")
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    assert report.ok, report.summary()
    assert named(report, "hidden size").ok
    assert family({"architectures": ["LlamaForCausalLMEagle3"]}) == "eagle3"


def test_eagle3_drafter_for_vllm_eagle3_passes(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "Eagle3LlamaForCausalLM")
    report = check_condition(pilot_for(tmp_path, drafter, engine="vllm", algorithm="eagle3"),
                             "cand")
    assert report.ok, report.summary()


def eagle_head(folder: Path, reads: int, hidden_size: int = 16) -> Path:
    """An EAGLE head published with a plain LlamaForCausalLM config (as EAGLE-3 checkpoints
    commonly are): one decoder layer and an fc over ``reads`` of the target's hidden states."""
    fake_model(folder, "LlamaForCausalLM", hidden_size=hidden_size, weights=False)
    save_file({"fc.weight": np.zeros((hidden_size, reads * hidden_size), dtype=np.float32),
               "midlayer.self_attn.q_proj.weight": np.zeros((hidden_size, hidden_size),
                                                            dtype=np.float32)},
              str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(("algorithm", "reads"), [("eagle3", 3), ("eagle", 2)])
def test_an_eagle_head_with_a_llama_config_passes_for_vllm_only(
    tmp_path: Path, algorithm: str, reads: int
) -> None:
    """vLLM loads a LlamaForCausalLM config under eagle/eagle3 as its own draft class;
    SGLang looks the class up by name and does not."""
    drafter = eagle_head(tmp_path / "head", reads)
    report = check_condition(pilot_for(tmp_path, drafter, engine="vllm", algorithm=algorithm),
                             "cand")
    assert report.ok, report.summary()
    detail = named(report, "architecture").detail
    assert "an EAGLE head (fc.weight [16, " in detail and f"its {algorithm} draft" in detail
    assert named(report, "hidden size").ok  # checked as for any EAGLE drafter
    sglang = check_condition(
        pilot_for(tmp_path, drafter, engine="sglang", algorithm=algorithm.upper()), "cand")
    assert "architecture" in failed(sglang)


def test_a_plain_lm_given_as_eagle3_to_vllm_still_fails(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", "LlamaForCausalLM")  # no fc: a whole model
    report = check_condition(pilot_for(tmp_path, drafter, engine="vllm", algorithm="eagle3"),
                             "cand")
    detail = failed(report)["architecture"]
    assert "no fc.weight: a plain causal LM" in detail and "draft_model" in detail
    wide = eagle_head(tmp_path / "wide", 3, hidden_size=8)  # reads a narrower target
    report = check_condition(pilot_for(tmp_path, wide, engine="vllm", algorithm="eagle3"),
                             "cand")
    assert "hidden size" in failed(report)


def test_a_drafter_folder_absent_here_is_said_so(tmp_path: Path) -> None:
    """Only a dry run gets a pilot whose drafter folder is not on this machine."""
    report = check_condition(
        pilot_for(tmp_path, Path("/models/eagle3-head"), engine="sglang", algorithm="EAGLE3"),
        "cand")
    assert failed(report) == {"drafter": (
        "/models/eagle3-head: no such folder on this machine, so the checkpoint was not "
        "checked; run the check where the drafter is")}


def test_plain_drafter_for_sglang_eagle3_fails_naming_both(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", "LlamaForCausalLM")
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    assert not report.ok
    detail = failed(report)["architecture"]
    assert "LlamaForCausalLM" in detail and "causal-lm" in detail
    assert "sglang EAGLE3" in detail and "eagle3" in detail
    # What SGLang needs instead, and where this checkpoint does fit.
    assert "a LlamaForCausalLMEagle3 checkpoint" in detail
    assert "speculation.algorithm STANDALONE" in detail
    assert report.summary().startswith("cand: architecture: ")
    vllm = check_condition(pilot_for(tmp_path, drafter, engine="vllm", algorithm="eagle3"),
                           "cand")
    assert "speculation.algorithm draft_model" in failed(vllm)["architecture"]


def test_eagle3_name_sglang_does_not_register_fails(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "Eagle3LlamaForCausalLM")  # vLLM's class name
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    detail = failed(report)["architecture"]
    assert "SGLang has no class" in detail and "LlamaForCausalLMEagle3" in detail


def test_eagle3_drafter_for_plain_assisted_fails(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle3")
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert "eagle3 drafter" in failed(report)["architecture"]


def test_eagle_vs_eagle3_families_are_told_apart(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle")
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    assert "is a eagle drafter" in failed(report)["architecture"]
    assert check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE"),
                           "cand").ok


def test_architectures_given_as_a_string_or_odd_values() -> None:
    assert family({"architectures": "LlamaForCausalLMEagle3"}) == "eagle3"
    assert family({"architectures": [None, 3, "EagleModel"]}) == "eagle"
    assert family({}) == "causal-lm"


# --------------------------------------------------------------------------- vocabulary


def test_vocab_mismatch_fails_naming_both_sizes(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", vocab_size=32)
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    detail = failed(report)["vocabulary"]
    assert "target vocab_size 8" in detail and "drafter vocab_size 32" in detail
    assert "no token map" in detail


def test_vocab_mismatch_with_token_map_passes(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle3", vocab_size=4,
                         extra={"draft_vocab_size": 4})
    save_file({"d2t": np.array([0, 1, 1, 2], dtype=np.int64)},
              str(drafter / "maps.safetensors"))
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    assert report.ok, report.summary()
    assert "(token map present)" in named(report, "vocabulary").detail
    (drafter / "maps.safetensors").unlink()  # draft_vocab_size alone: no map to read ids with
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    assert failed(report) == {"vocabulary maps": (
        "draft_vocab_size 4 != target vocab_size 8 and no d2t map in the weights (draft ids "
        "would be read as target ids)")}


def test_vocab_mismatch_with_d2t_file_passes(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle3", vocab_size=4)
    np.save(drafter / "d2t.npy", np.arange(4))
    report = check_condition(pilot_for(tmp_path, drafter, engine="vllm", algorithm="eagle3"),
                             "cand")
    assert named(report, "vocabulary").ok


def test_vocab_read_from_text_config_of_a_multimodal_target(tmp_path: Path) -> None:
    target = fake_model(tmp_path / "target", "LlavaForConditionalGeneration", vocab_size=999,
                        extra={"text_config": {"vocab_size": 8, "hidden_size": 16}})
    drafter = fake_model(tmp_path / "drafter")
    assert check_condition(pilot_for(tmp_path, drafter, target=target), "cand").ok


def test_tokenizer_mismatch_fails(tmp_path: Path) -> None:
    other = dict(VOCAB)
    other["a"], other["b"] = other["b"], other["a"]  # same size, different ids
    drafter = fake_model(tmp_path / "drafter", vocab=other)
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert set(failed(report)) == {"tokenizer"}
    assert "target tokenizer" in failed(report)["tokenizer"]


def test_corrupt_tokenizer_is_a_failed_check_not_an_exception(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    (drafter / "tokenizer.json").write_text("{not json", encoding="utf-8")
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert "tokenizer.json: unreadable" in failed(report)["tokenizer"]


def test_missing_tokenizer_is_not_checked(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    (drafter / "tokenizer.json").unlink()
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert report.ok and "tokenizer" not in {c.name for c in report.checks}


# --------------------------------------------------------------------------- hidden size


def test_hidden_size_mismatch_for_eagle_drafters(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle3", hidden_size=32)
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    detail = failed(report)["hidden size"]
    assert "target hidden size 32" in detail and "target has 16" in detail


def test_target_hidden_size_key_wins_for_eagle(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "eagle", "LlamaForCausalLMEagle3", hidden_size=32,
                         extra={"target_hidden_size": 16})
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3"),
                             "cand")
    assert report.ok, report.summary()


# --------------------------------------------------------------------------- EAGLE-3 layout


def fake_eagle3(
    folder: Path,
    *,
    hidden: int = 16,
    vocab: int = 8,
    draft_vocab: int = 4,
    layer_ids: list[int] | None = None,
    fc_in: int | None = None,
    lm_rows: int | None = None,
    d2t: np.ndarray | None = None,
    t2d_len: int | None = None,
) -> Path:
    """An EAGLE-3 checkpoint in SGLang's layout: fc over 3 target layers, lm_head over the
    draft vocabulary, d2t offsets and a t2d mask."""
    extra: dict[str, Any] = {
        "draft_vocab_size": draft_vocab,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids or [0, 1, 2]},
    }
    folder = fake_model(folder, "LlamaForCausalLMEagle3", vocab_size=vocab, hidden_size=hidden,
                        extra=extra, weights=False)
    keep = np.array([0, 2, 5, 7][:draft_vocab] + list(range(8, 4 + draft_vocab)))
    flags = np.zeros(t2d_len or vocab, dtype=np.bool_)
    flags[keep[keep < len(flags)]] = True  # t2d flags the target ids d2t maps to
    tensors = {
        "fc.weight": np.zeros((hidden, fc_in or 3 * hidden), dtype=np.float32),
        "lm_head.weight": np.zeros((lm_rows or draft_vocab, hidden), dtype=np.float32),
        "d2t": d2t if d2t is not None else (keep - np.arange(draft_vocab)).astype(np.int64),
        "t2d": flags,
    }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def eagle3_report(tmp_path: Path, drafter: Path, layers: int = 4) -> ArtifactReport:
    target = fake_model(tmp_path / "deep-target", extra={"num_hidden_layers": layers})
    return check_condition(
        pilot_for(tmp_path, drafter, engine="sglang", algorithm="EAGLE3", target=target), "cand")


def test_eagle3_layout_that_fits_passes(tmp_path: Path) -> None:
    report = eagle3_report(tmp_path, fake_eagle3(tmp_path / "e3"))
    assert report.ok, report.summary()
    assert named(report, "aux layers").detail == (
        "target layers [0, 1, 2] of 4 (eagle_aux_hidden_state_layer_ids)")
    assert named(report, "vocabulary maps").detail == "draft vocabulary 4 of 8 (d2t, t2d)"


def test_eagle3_aux_layers_beyond_the_targets_depth_fail(tmp_path: Path) -> None:
    drafter = fake_eagle3(tmp_path / "e3", layer_ids=[1, 2, 3])
    report = eagle3_report(tmp_path, drafter, layers=4)
    assert set(failed(report)) == {"aux layers"}
    detail = failed(report)["aux layers"]
    assert "[1, 2, 3]: [3] outside the target's 4 layers" in detail
    assert "ids run 0..2" in detail
    assert eagle3_report(tmp_path, drafter, layers=5).ok  # a deeper target has a layer 3 output


def test_eagle3_default_capture_needs_a_deep_enough_target(tmp_path: Path) -> None:
    drafter = fake_eagle3(tmp_path / "e3")
    config = json.loads((drafter / "config.json").read_text())
    del config["eagle_config"]
    (drafter / "config.json").write_text(json.dumps(config))
    assert "SGLang's default" in named(eagle3_report(tmp_path, drafter, layers=16),
                                       "aux layers").detail
    assert "[-1]" in failed(eagle3_report(tmp_path, drafter, layers=3))["aux layers"]


def test_eagle3_fc_width_must_match_layers_times_hidden(tmp_path: Path) -> None:
    report = eagle3_report(tmp_path, fake_eagle3(tmp_path / "e3", fc_in=32))
    assert failed(report) == {"aux layers": (
        "fc.weight has shape [16, 32]: it must read 3 target layers x hidden size 16 = 48 "
        "features")}


def test_eagle3_hidden_size_of_another_target_fails(tmp_path: Path) -> None:
    report = eagle3_report(tmp_path, fake_eagle3(tmp_path / "e3", hidden=32))
    assert failed(report)["hidden size"] == (
        "drafter expects target hidden size 32 (its fc reads 3 target layers of that width), "
        "target has 16: its hidden_size is another target's; use a draft trained on this "
        "target's hidden states")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"lm_rows": 5}, "lm_head has 5 rows, draft_vocab_size is 4"),
        ({"d2t": np.zeros(3, dtype=np.int64)},
         "d2t has shape [3], expected [4] (draft_vocab_size)"),
        ({"t2d_len": 6}, "t2d has shape [6], expected [8] (target vocab_size)"),
        ({"d2t": np.array([0, 1, 2, 9], dtype=np.int64)},
         "d2t maps 1 draft ids outside the target's vocabulary of 8 (first: draft id 3)"),
        ({"d2t": np.array([-1, 0, 0, 0], dtype=np.int32)},
         "d2t maps 1 draft ids outside the target's vocabulary of 8 (first: draft id 0)"),
    ],
)
def test_eagle3_vocabulary_maps_of_the_wrong_size_fail(
    tmp_path: Path, kwargs: dict[str, Any], says: str
) -> None:
    report = eagle3_report(tmp_path, fake_eagle3(tmp_path / "e3", **kwargs))
    assert failed(report) == {"vocabulary maps": says}


MODELS = ROOT / "fixtures" / "models"


def test_shipped_tiny_eagle3_fits_the_tiny_target_for_sglang(tmp_path: Path) -> None:
    if not (MODELS / "tiny-eagle3" / "config.json").is_file():
        pytest.skip(f"no tiny EAGLE-3 drafter shipped under {MODELS}")
    pilot = pilot_for(tmp_path, MODELS / "tiny-eagle3", engine="sglang", algorithm="EAGLE3",
                      target=MODELS / "tiny-target")
    report = check_condition(pilot, "cand")
    assert report.ok, report.summary()
    assert {"architecture", "hidden size", "aux layers", "vocabulary maps", "draft layers"} <= {
        c.name for c in report.checks}
    assert named(report, "draft layers").detail == "1 decoder layer(s), all in the weights"


def test_the_shipped_plain_drafter_given_as_eagle3_is_told_to_use_standalone(
    tmp_path: Path,
) -> None:
    plain = check_condition(pilot_for(tmp_path, MODELS / "tiny-drafter", engine="sglang",
                                      algorithm="EAGLE3", target=MODELS / "tiny-target"), "cand")
    assert "speculation.algorithm STANDALONE" in failed(plain)["architecture"]


# --------------------------------------------------------------------------- weights


def test_truncated_safetensors_fails(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    weights = drafter / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    detail = failed(report)["weights"]
    assert detail.startswith("model.safetensors: truncated or padded")
    with pytest.raises(ValueError, match="truncated"):
        safetensors_header(weights)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"abc", "shorter than a safetensors header"),
        (struct.pack("<Q", 10**12) + b"{}", "implausible header length"),
        (struct.pack("<Q", 0), "implausible header length"),
        (struct.pack("<Q", 4) + b"[1]\n", "malformed safetensors header"),
        (struct.pack("<Q", 12) + b'{"w": {}}   ', "malformed safetensors header"),
        (struct.pack("<Q", 6) + b"{nope}", "Expecting property name"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "Expecting value"),
    ],
)
def test_malformed_safetensors_fail_cleanly(tmp_path: Path, content: bytes, says: str) -> None:
    drafter = fake_model(tmp_path / "drafter")
    (drafter / "model.safetensors").write_bytes(content)
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert says in failed(report)["weights"]


def test_every_shard_is_checked(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    save_file({"x": np.zeros(3, dtype=np.float16)}, str(drafter / "model-00002.safetensors"))
    (drafter / "model-00003.safetensors").write_bytes(b"")
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    weights = [c for c in report.checks if c.name == "weights"]
    assert [c.ok for c in weights] == [True, False, True]  # sorted: -00002, -00003, model


def test_missing_weights_fail(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", weights=False)
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert failed(report)["weights"] == f"no *.safetensors in {drafter}"


def test_missing_drafter_config_fails(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    (drafter / "config.json").unlink()
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert failed(report) == {"config": f"{drafter}/config.json is missing"}


def test_unreadable_drafter_config_fails(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    (drafter / "config.json").write_text("{", encoding="utf-8")
    report = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert "config.json: unreadable" in failed(report)["config"]


def test_speculation_without_a_drafter_fails(tmp_path: Path) -> None:
    report = check_condition(pilot_for(tmp_path, None, algorithm="assisted"), "cand")
    assert failed(report) == {"drafter": "assisted needs a drafter checkpoint"}


def test_ngram_needs_no_drafter(tmp_path: Path) -> None:
    report = check_condition(pilot_for(tmp_path, None, engine="sglang", algorithm="NGRAM"), "cand")
    assert report.ok and named(report, "algorithm").detail == "NGRAM needs no drafter"


def test_target_given_as_a_model_id_checks_the_drafter_alone(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    report = check_condition(
        pilot_for(tmp_path, drafter, engine="sglang", target="meta-llama/Llama-3.1-8B"), "cand"
    )
    assert report.ok
    assert named(report, "target config").ok


# --------------------------------------------------------------------------- pins


def test_sha256_pin_right_and_wrong(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    digest = hashlib.sha256((drafter / "model.safetensors").read_bytes()).hexdigest()
    right = check_condition(
        pilot_for(tmp_path, drafter, pins={"sha256": {"model.safetensors": digest.upper()}}),
        "cand",
    )
    assert named(right, "sha256 model.safetensors").ok
    wrong = check_condition(
        pilot_for(tmp_path, drafter, pins={"sha256": {"model.safetensors": "0" * 64}}), "cand"
    )
    assert failed(wrong)["sha256 model.safetensors"] == f"expected {'0' * 64}, found {digest}"
    missing = check_condition(
        pilot_for(tmp_path, drafter, pins={"sha256": {"gone.bin": "0" * 64}}), "cand"
    )
    assert failed(missing)["sha256 gone.bin"].endswith("found missing")


@pytest.mark.parametrize("name", ["LICENSE", "LICENSE.md", "license.txt", "COPYING"])
def test_license_required_and_present(tmp_path: Path, name: str) -> None:
    drafter = fake_model(tmp_path / "drafter", license_file=name)
    report = check_condition(pilot_for(tmp_path, drafter, pins={"require_license": True}), "cand")
    assert named(report, "license").ok
    assert name in named(report, "license").detail


def test_license_required_and_missing(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    report = check_condition(pilot_for(tmp_path, drafter, pins={"require_license": True}), "cand")
    assert failed(report) == {"license": f"license file: none in {drafter}"}
    unpinned = check_condition(pilot_for(tmp_path, drafter), "cand")
    assert "license" not in {c.name for c in unpinned.checks}


@pytest.mark.parametrize(
    ("pin", "version", "ok"),
    [
        ("0.5.23", "0.5.23", True),
        ("0.5", "0.5.23", True),
        ("0.5.23", "0.5.23rc1", True),
        ("2.13.0", "2.13.0+cpu", True),
        ("0.5.23", "0.5.22", False),
        ("0.5.2", "0.5.23", False),  # a prefix on a component boundary only
        ("0.5.", "0.5.23", True),
        ("0.5.23", None, False),
    ],
)
def test_engine_version_pin(tmp_path: Path, pin: str, version: str | None, ok: bool) -> None:
    drafter = fake_model(tmp_path / "drafter")
    pilot = pilot_for(tmp_path, drafter, pins={"engine_version": pin})
    check = named(check_condition(pilot, "cand", version), "engine version")
    assert check.ok is ok
    found = version or "unknown (engine not importable)"
    assert check.detail == f"pinned {pin}, found {found}"


def test_check_all_asks_the_engines_own_python_for_its_version(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    installed = importlib.metadata.version("transformers")
    pilot = pilot_for(tmp_path, drafter, pins={"engine_version": installed})
    reports = check_all(pilot, ["base", "cand"])
    assert reports["base"].checks == []
    assert named(reports["cand"], "engine version").detail == (
        f"pinned {installed}, found {installed}"
    )
    assert reports["cand"].ok


# --------------------------------------------------------------------------- other conditions


def test_unknown_algorithm_lists_valid_ones(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter")
    report = check_condition(pilot_for(tmp_path, drafter, engine="sglang", algorithm="MEDUSA"),
                             "cand")
    assert failed(report) == {
        "algorithm": "sglang has no algorithm 'MEDUSA'; valid: EAGLE, EAGLE3, STANDALONE"
    }
    report = check_condition(pilot_for(tmp_path, drafter, engine="vllm", algorithm="EAGLE3"),
                             "cand")
    assert "valid: draft_model, eagle, eagle3" in failed(report)["algorithm"]


def test_baseline_returns_no_checks(tmp_path: Path) -> None:
    drafter = fake_model(tmp_path / "drafter", vocab_size=99)  # broken, but not the baseline's
    report = check_condition(pilot_for(tmp_path, drafter), "base")
    assert report.checks == [] and report.ok
    assert report.summary() == "base: artifact fits (0 checks)"


def test_endpoint_condition_returns_no_checks(tmp_path: Path) -> None:
    pilot = make_pilot(
        target={"engine": "endpoint", "model": "served"},
        conditions={
         "base": {"role": "baseline",
                  "endpoint": {"url": "http://127.0.0.1:1", "protocol": "openai"}},
         "cand": {"role": "candidate", "drafter": str(tmp_path / "nowhere"),
                  "endpoint": {"url": "http://127.0.0.1:2", "protocol": "sglang"}},
     },
        trace={"files": ["t.jsonl"]},
    )
    assert check_condition(pilot, "cand").checks == []


def test_via_load_pilot_with_the_repo_pilot_layout(tmp_path: Path) -> None:
    text = (ROOT / "pilot.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    proj = tmp_path / "proj"
    fake_model(proj / data["target"]["model"])
    candidates = [n for n, c in data["conditions"].items() if c.get("drafter")]
    for name in candidates:
        fake_model(proj / data["conditions"][name]["drafter"], hidden_size=8,
                   license_file="LICENSE")
    for name in data["trace"]["files"]:
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text("{}\n", encoding="utf-8")
    (proj / "pilot.yaml").write_text(text, encoding="utf-8")
    pilot = load_pilot(proj / "pilot.yaml")
    assert candidates
    for name in candidates:
        report = check_condition(pilot, name)
        assert report.ok, report.summary()
        if pilot.conditions[name].pins.require_license:
            assert named(report, "license").ok
    assert check_condition(pilot, pilot.baseline).checks == []
