"""Chat prompts reach every engine through the target's chat template: a campaign over one
chat prompt and one plain prompt, on each engine, and what each engine was sent (the fake
servers record the text; the embedded engine is watched in process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.engines.chat_template import load_chat_tokenizer, template_digest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.pilot.trace import Prompt, Trace, render_prompt
from testkit.endpoint_pilot import sglang_routes
from testkit.factories import TINY_TARGET, make_pilot
from testkit.fake_server import ScriptedServer
from testkit.pilot_run import Events, fake_target

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
CHAT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"})
# The template's own output, written out. The tiny tokenizer adds no BOS when it encodes, so
# the template's is kept.
RENDERED = "<s><|system|>Be brief.\n<|user|>Hi there\n<|assistant|>"
PLAIN = "def f(x):"


def prompt(pid: str, text: str | None = None, messages: Any = None) -> Prompt:
    return Prompt(id=pid, domain="chat", slice="core", prompt=text, messages=messages,
                  max_new_tokens=2, expect=None, file="t.jsonl", line=1)


TRACE = Trace.from_prompts([prompt("chat", messages=CHAT), prompt("plain", PLAIN)])


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with this test's chat template (it ships one of its own)."""
    if not (TINY_TARGET / "config.json").is_file():
        pytest.skip(f"no tiny target at {TINY_TARGET}")
    folder = tmp_path_factory.mktemp("chat-target")
    for item in TINY_TARGET.iterdir():
        if item.suffix == ".safetensors":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    # transformers reads chat_template.jinja first where a tokenizer folder has one.
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


def campaign(pilot_data: dict[str, Any], folder: Path) -> Any:
    pilot = make_pilot(
        {"base": {"role": "baseline", **pilot_data.pop("condition", {})}},
        load={"levels": {"low": 1}, "warmup_requests": 0, "passes": 1},
        decision={"early_stop": False}, **pilot_data,
    )
    return Campaign(pilot, TRACE, folder / "res", ["base"]).run()


def sent(records: Any) -> None:
    """Both requests completed, and the fingerprint names the template."""
    assert [r.ok for r in records.records] == [True, True], [r.error for r in records.records]
    fp = records.meta.conditions["base"].fingerprint
    assert fp["chat_template"].startswith("sha256:"), fp


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_booted_servers_are_sent_the_chat_template(
        engine: str, chat_model: Path, tmp_path: Path) -> None:  # fmt: skip
    events = tmp_path / "events.txt"
    target = fake_target(engine, env={"OSPREY_FAKE_EVENTS": str(events)}, model=str(chat_model))
    saved = campaign({"target": target}, tmp_path)
    sent(saved)
    assert sorted(Events(events).prompts()) == sorted([RENDERED, PLAIN])


def test_an_endpoint_is_sent_the_chat_template(chat_model: Path, tmp_path: Path) -> None:
    with ScriptedServer(routes=sglang_routes()) as srv:
        saved = campaign({"target": {"engine": "endpoint", "model": str(chat_model)},
                          "condition": {"endpoint": {"url": srv.url, "protocol": "sglang"}}},
                         tmp_path)
        texts = [b["text"] for b in srv.bodies("/generate")]
    sent(saved)
    assert sorted(texts) == sorted([RENDERED, PLAIN])


def test_the_embedded_engine_is_sent_the_chat_template(
    chat_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    generate = TransformersEngine.generate

    async def watched(self: TransformersEngine, request: Any) -> Any:
        seen.append(request.prompt)
        return await generate(self, request)

    monkeypatch.setattr(TransformersEngine, "generate", watched)
    saved = campaign({"target": {"engine": "transformers", "model": str(chat_model)}}, tmp_path)
    sent(saved)
    assert sorted(seen) == sorted([RENDERED, PLAIN])


def test_without_a_template_chats_use_the_plain_layout_and_say_so(tmp_path: Path) -> None:
    if not (TINY_TARGET / "config.json").is_file():
        pytest.skip(f"no tiny target at {TINY_TARGET}")
    bare = tmp_path / "no-template"  # the tiny target ships a template: a copy without it
    bare.mkdir()
    for item in TINY_TARGET.iterdir():
        if item.name != "chat_template.jinja":
            shutil.copy(item, bare / item.name)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer, said = load_chat_tokenizer(str(bare))
    assert tokenizer is None and "no chat template" in said
    assert template_digest(tokenizer) == "none"
    assert render_prompt(TRACE.prompts[0], tokenizer) == (
        "System: Be brief.\nUser: Hi there\nAssistant:")
    tokenizer, said = load_chat_tokenizer("no-such-org/no-such-model")
    assert tokenizer is None and "neither a folder nor in the local Hugging Face cache" in said


class _BosTokenizer:
    """A tokenizer whose encoding puts BOS first, and whose template writes one too."""

    bos_token, bos_token_id, chat_template = "<s>", 1, "x"

    def apply_chat_template(self, messages: Any, tokenize: bool,
                            add_generation_prompt: bool) -> str:  # fmt: skip
        return "<s>[" + "|".join(m["content"] for m in messages) + "]"

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [1, 7]}


def test_a_templates_bos_is_dropped_where_the_tokenizer_adds_its_own() -> None:
    """Engines tokenize what they are sent with special tokens: one BOS, as a chat
    deployment's model sees it, not two."""
    assert render_prompt(TRACE.prompts[0], _BosTokenizer()) == "[Be brief.|Hi there]"
