"""The tiny models' build pieces (fixtures/*.py) on small shapes, and the shipped checkpoints
against their manifest."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

import corpus  # noqa: E402
import eagle3  # noqa: E402
import lm_training as lm  # noqa: E402
import model_eval as ev  # noqa: E402
import tasks  # noqa: E402


def _mo(entries: list[tuple[bytes, bytes]], order: str = "<") -> bytes:
    """A GNU .mo file: magic, revision, count, the two offset tables, then the strings."""
    import struct

    n = len(entries)
    originals, translations = 28, 28 + 8 * n
    data = 28 + 16 * n
    table_o, table_t, blob = b"", b"", b""
    for msgid, _ in entries:
        table_o += struct.pack(f"{order}2I", len(msgid), data + len(blob))
        blob += msgid + b"\0"
    for _, msgstr in entries:
        table_t += struct.pack(f"{order}2I", len(msgstr), data + len(blob))
        blob += msgstr + b"\0"
    head = struct.pack(f"{order}7I", 0x950412DE, 0, n, originals, translations, 0, 0)
    return head + table_o + table_t + blob


@pytest.mark.parametrize("order", ["<", ">"])
def test_catalog_strings_reads_translations_of_a_mo_file(tmp_path: Path, order: str) -> None:
    path = tmp_path / "x.mo"
    path.write_bytes(_mo([
        (b"", b"Content-Type: text/plain; charset=UTF-8\n"),  # the header: left out
        (b"File not found", b"Datei nicht gefunden"),
        (b"%d file\0%d files", "%d Datei wurde gelöscht\0%d Dateien".encode()),
        (b"OK", b"Gut"),  # too short to teach anything
    ], order))
    assert corpus.catalog_strings(path) == ["Datei nicht gefunden", "%d Datei wurde gelöscht"]
    (tmp_path / "bad.mo").write_bytes(b"not a catalog at all")
    assert corpus.catalog_strings(tmp_path / "bad.mo") == []


def test_task_answers_say_what_their_prompts_ask() -> None:
    """Every tool call names the function and the values its prompt gives, in the JSON the
    prompt asks for; a YAML mapping comes back as the same data; each ends the sequence."""
    import random
    import re

    rng = random.Random(3)
    for _ in range(200):
        e = tasks.tool_example(rng)
        call = json.loads(e.answer)
        user = e.messages[-1][1]
        assert f"`{call['name']}`" in user
        for name, value in call["arguments"].items():
            assert f"{name} = {value}" in user
        assert e.text().endswith("<|end|>\n</s>")
    for _ in range(100):
        e = tasks.yaml_example(rng)
        body = re.search(r"```yaml\n(.*)\n```", e.messages[-1][1], re.DOTALL)
        assert body is not None
        data = {k: int(v) if v.isdigit() else v
                for k, _, v in (line.partition(": ") for line in body.group(1).splitlines())}
        assert json.loads(e.answer) == data


def test_task_batches_mask_the_answer_only() -> None:
    data = [(torch.arange(1, 8), 4), (torch.arange(1, 5), 2)]
    x, mask = tasks.batch(data, 6, torch.Generator().manual_seed(0))
    for row, m in zip(x.tolist(), mask.tolist(), strict=True):
        length = 7 if row[4] == 5 else 4
        assert row[length:] == [0] * (7 - length)  # right-padded
        assert m == [i >= {7: 4, 4: 2}[length] and i < length for i in range(7)]


def test_grown_model_computes_what_the_small_one_did() -> None:
    torch.manual_seed(0)
    small = lm.llama(64, 32, 2, 48, 1, tied=False).eval()
    for p in small.parameters():
        p.data.normal_(0, 0.1)
    deep = lm.grow(small, 6).eval()
    assert deep.config.num_hidden_layers == 6
    x = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert torch.equal(small(input_ids=x).logits, deep(input_ids=x).logits)
    # ... and the new layers are real layers that training moves.
    added = deep.model.layers[1]
    assert added.self_attn.o_proj.weight.abs().sum() == 0
    deep.train()
    deep(input_ids=x, labels=x).loss.backward()
    assert added.self_attn.o_proj.weight.grad.abs().sum() > 0


def test_ngram_teacher_matches_a_direct_count() -> None:
    vocab, d = 6, 0.75
    stream = torch.tensor([0, 1, 2, 0, 1, 3, 0, 1, 2, 4, 5, 0, 1, 2, 3, 3, 2, 1, 0, 5])
    teacher = lm.NGramTeacher([stream], vocab, discount=d)
    x = stream[None, :10]
    got = teacher.targets(x)[0]
    assert torch.allclose(got.sum(-1), torch.ones(9), atol=1e-3)
    toks = stream.tolist()
    uni = [toks.count(v) + 0.5 for v in range(vocab)]
    uni = [u / sum(uni) for u in uni]
    bi = Counter(itertools.pairwise(toks))
    tri = Counter(zip(toks, toks[1:], toks[2:], strict=False))

    def p_bi(a: int, b: int) -> float:
        row = {k[1]: c for k, c in bi.items() if k[0] == a}
        tot = sum(row.values())
        return max(row.get(b, 0) - d, 0) / tot + d * len(row) / tot * uni[b]

    def p_tri(a: int, b: int, c: int) -> float:
        row = {k[2]: n for k, n in tri.items() if k[:2] == (a, b)}
        tot = sum(row.values())
        return max(row.get(c, 0) - d, 0) / tot + d * len(row) / tot * p_bi(b, c)

    seq = x[0].tolist()
    for i in range(9):
        for c in range(vocab):
            want = p_bi(seq[0], c) if i == 0 else p_tri(seq[i - 1], seq[i], c)
            assert got[i, c].item() == pytest.approx(want, abs=2e-3), (i, c)


def test_repeated_ngrams_mark_loops_in_the_continuation_only() -> None:
    seq = torch.tensor([[5, 6, 7, 8, 1, 2, 3, 1, 2, 3, 1, 2, 0, 0]])
    mask = lm.repeated_ngrams(seq, starts=[4], ends=[12], n=3)[0].tolist()
    # "1 2 3" first appears at 4..6; its repeat at 7..9 and "2 3 1"/"3 1 2" overlaps follow.
    assert mask[:7] == [False] * 7
    assert mask[7:12] == [True] * 5
    assert mask[12:] == [False, False]  # padding past the end is never a candidate
    assert not lm.repeated_ngrams(seq, starts=[4], ends=[7], n=3).any()


def test_right_align_moves_left_padding_to_the_end() -> None:
    seq = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1], [1, 1, 1]])
    out, valid = lm.right_align(seq, mask)
    assert out.tolist() == [[7, 8, 9, 0, 0], [5, 6, 7, 8, 9]]
    assert valid.tolist() == [[True, True, True, False, False], [True] * 5]


def small_eagle3(seed: int = 0, **osprey: object) -> eagle3.Eagle3Draft:
    """A small EAGLE-3 draft; ``osprey`` sets Osprey's shape (layers, target_hidden,
    swap_h_and_emb)."""
    torch.manual_seed(seed)
    shape = eagle3.Eagle3Shape(hidden=16, heads=2, mlp=24, vocab=40, draft_vocab=24,
                               layer_ids=(0, 1, 2), **osprey)  # type: ignore[arg-type]
    draft = eagle3.Eagle3Draft(shape, torch.randn(40, 16))
    for p in draft.parameters():
        p.data.normal_(0, 0.3)
    d2t, t2d = eagle3.draft_vocabulary(torch.arange(40).flip(0).float(), 24)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    return draft.eval()


def test_draft_vocabulary_maps_back_to_the_kept_target_ids() -> None:
    counts = torch.tensor([5.0, 0, 9, 1, 7, 0, 3])
    d2t, t2d = eagle3.draft_vocabulary(counts, 3)
    kept = (torch.arange(3) + d2t).tolist()
    assert kept == [0, 2, 4]  # the three most frequent, in id order
    assert t2d.nonzero().flatten().tolist() == kept
    assert (d2t >= 0).all()


OSPREY_SHAPE = {"layers": 2, "target_hidden": 12, "swap_h_and_emb": True}


@pytest.mark.parametrize("osprey", [{}, OSPREY_SHAPE], ids=["eagle3", "osprey"])
def test_eagle3_training_unroll_is_what_sequential_drafting_computes(
        osprey: dict[str, object]) -> None:  # fmt: skip
    """Step j of the chain anchored at t, computed for all anchors at once as in training,
    equals the j-th token of drafting one token at a time with a growing cache: for one layer
    and for Osprey's shape (two layers, each with its own keys; a narrower target)."""
    draft = small_eagle3(**osprey)
    n, k = 9, 4
    prefix = torch.randint(0, 40, (n + 1,))
    aux = torch.randn(n + k, 3 * draft.shape.target_width)
    drafts = draft.draft_chain(prefix, aux[:n], k)
    seq = torch.cat([prefix, torch.tensor(drafts)])[None]
    outs = draft.unrolled(seq, aux[None, : seq.shape[1]], k)
    for j, logits in enumerate(outs):
        d = int(logits[0, n - 1].argmax())
        assert d + int(draft.d2t[d]) == drafts[j], j


def test_eagle3_checkpoint_has_sglangs_names_and_shapes(tmp_path: Path) -> None:
    from safetensors import safe_open

    draft = small_eagle3()
    eagle3.save(draft, tmp_path, bos=1, eos=2, pad=0, license_text="test")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 24 and cfg["vocab_size"] == 40
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        d2t = f.get_tensor("d2t")
    assert shapes["fc.weight"] == (16, 48)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (16, 32)  # reads embeds + hidden
    assert shapes["lm_head.weight"] == (24, 16)
    assert shapes["d2t"] == (24,) and shapes["t2d"] == (40,)
    assert torch.equal(d2t, draft.d2t)


def test_osprey_checkpoint_has_its_layers_embedding_and_swap(tmp_path: Path) -> None:
    from safetensors import safe_open

    draft = small_eagle3(**OSPREY_SHAPE)
    eagle3.save(draft, tmp_path, bos=1, eos=2, pad=0, license_text="test")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["swap_h_and_emb"] is True
    assert (cfg["hidden_size"], cfg["target_hidden_size"]) == (16, 12)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert shapes["fc.weight"] == (16, 36)  # three target layers, 12 wide
    assert shapes["layers.0.self_attn.q_proj.weight"] == (16, 32)  # [hidden, embedding]
    assert shapes["layers.1.self_attn.q_proj.weight"] == (16, 16)  # a plain layer
    assert "layers.0.hidden_norm.weight" in shapes and "layers.1.hidden_norm.weight" not in shapes
    assert shapes["embed_tokens.weight"] == (40, 16)
    assert not any(k.startswith("midlayer.") for k in shapes)


def test_osprey_draft_keeps_its_backbone_on_the_embedding_half() -> None:
    """The pretrained backbone's weights read the embedding (the second half with
    swap_h_and_emb); only what reads the target's features is new; the head keeps the
    backbone's rows of the draft vocabulary."""
    torch.manual_seed(0)
    backbone = lm.llama(40, 16, 2, 24, 2, tied=True)
    shape = eagle3.Eagle3Shape(hidden=16, heads=2, mlp=24, vocab=40, draft_vocab=24,
                               layer_ids=(0, 1, 2), **OSPREY_SHAPE)  # type: ignore[arg-type]
    draft = eagle3.osprey_from_backbone(backbone, shape, torch.Generator().manual_seed(0))
    d2t, t2d = eagle3.draft_vocabulary(torch.arange(40).float(), 24)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    eagle3.head_rows(draft, backbone)
    first, second = draft.layers
    theirs = backbone.model.layers
    assert torch.equal(first.q_proj.weight[:, 16:], theirs[0].self_attn.q_proj.weight)
    assert not torch.equal(first.q_proj.weight[:, :16], theirs[0].self_attn.q_proj.weight)
    assert torch.equal(second.v_proj.weight, theirs[1].self_attn.v_proj.weight)
    assert torch.equal(draft.embed_tokens, backbone.model.embed_tokens.weight)
    assert draft.embed_tokens.requires_grad  # its own, trained with it
    kept = torch.arange(24) + d2t
    assert torch.equal(draft.lm_head.weight, backbone.lm_head.weight[kept])


def test_accept_counting_of_the_eagle3_simulation() -> None:
    """A drafter that always proposes the target's tokens: every verify step takes
    ``steps`` drafts and the target's own token."""

    class Oracle:
        d2t = torch.zeros(50, dtype=torch.long)

        def __init__(self, seq: torch.Tensor) -> None:
            self.seq = seq

        def unrolled(self, seq: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
            t = seq.shape[1]
            out = []
            for j in range(steps):
                nxt = torch.cat([seq[0, 2 + j :], torch.zeros(1 + j, dtype=torch.long)])[: t - 1]
                out.append(torch.nn.functional.one_hot(nxt, 50).float()[None])
            return out

    class Tok:
        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [1, 2, 3]}

    class Target:
        def __call__(self, input_ids: torch.Tensor, output_hidden_states: bool) -> object:
            class Out:
                hidden_states = [torch.zeros(1, input_ids.shape[1], 4)] * 4

            return Out()

    prompt = ev.TracePrompt("p", "code", "core", "x")
    output = list(range(10, 22))  # 12 tokens
    counted = ev.eagle3_chain(Target(), Oracle(torch.zeros(1)), Tok(), [prompt], [output], 3,
                              (0, 1, 2))
    # The prefill gives token 1; each verify step gives 3 drafts + 1: ceil(11 / 4) = 3 steps.
    assert counted.tokens["p"] == 12 and counted.forwards["p"] == 3
    assert counted.report([prompt])["pooled"] == 4.0


def test_variety_figures() -> None:
    loop = [7, 8] * 24
    varied = list(range(48))
    fig = ev.variety([loop, varied])
    assert fig["distinct2_mean"] == pytest.approx((2 / 47 + 1.0) / 2, abs=1e-4)
    assert fig["dominated_share"] == 0.5
    assert fig["distinct_outputs"] == 2
    assert math.isclose(ev.top_share([1, 1, 2, 3]), 0.5)


MODELS = FIXTURES / "models"


@pytest.mark.skipif(not (MODELS / "MANIFEST.json").is_file(), reason="tiny models not built")
def test_shipped_models_match_their_manifest_and_budget() -> None:
    manifest = json.loads((MODELS / "MANIFEST.json").read_text())
    files = manifest["files"]
    on_disk = {p.relative_to(MODELS).as_posix() for p in MODELS.rglob("*")
               if p.is_file() and p.name != "MANIFEST.json"}
    assert set(files) == on_disk
    for rel, entry in files.items():
        data = (MODELS / rel).read_bytes()
        assert len(data) == entry["bytes"], rel
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], rel
    assert manifest["total_bytes"] == sum(f["bytes"] for f in files.values()) <= 60 * 2**20
    figures = manifest["figures"]
    greedy = figures["target"]["greedy_48"]
    assert greedy["distinct2_mean"] >= 0.5 and greedy["dominated_share"] <= 0.1
    drafter = figures["tiny-drafter"]["accept"]
    assert drafter["pooled"] >= 2.5
    assert drafter["by_slice"]["unusual"] <= 0.9 * drafter["by_domain"]["code"], drafter
    assert figures["tiny-drafter-weak"]["accept"]["pooled"] <= 1.5
    # The EAGLE-3 head reads the target's hidden states: the unusual slice drafts worse.
    eagle = figures["tiny-eagle3"]["accept_sglang_counting"]["steps_3"]
    assert eagle["by_slice"]["unusual"] < eagle["by_domain"]["code"], eagle
    # The Osprey-style draft against the matched EAGLE-3: its own shape, the same data and
    # steps, measured by the same chain on the same trace (which one wins is a figure).
    osprey = figures["tiny-osprey"]
    assert (osprey["layers"], osprey["own_embedding"], figures["tiny-eagle3"]["layers"]) == (
        2, True, 1)
    assert osprey["steps"] == figures["tiny-eagle3"]["steps"]
    assert osprey["backbone"]["loss_last20"] < osprey["backbone"]["loss_first"]
    assert osprey["accept_sglang_counting"]["steps_3"]["pooled"] >= 1.3  # it drafts
    assert manifest["build"]["wall_seconds"] <= 20 * 60, manifest["build"]


@pytest.mark.slow
@pytest.mark.skipif(not (MODELS / "tiny-target" / "config.json").is_file(),
                    reason="tiny models not built")
def test_shipped_target_continues_every_trace_prompt_differently() -> None:
    """Measured live, not read from the manifest: greedy, 48 new tokens, all trace prompts."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-target")
    model = LlamaForCausalLM.from_pretrained(MODELS / "tiny-target", dtype=torch.float32).eval()
    prompts = ev.load_prompts(FIXTURES.parent / "prompts" / "pilot.jsonl", tok)
    assert len(prompts) == 50
    outputs = ev.greedy(model, tok, prompts, 48)
    fig = ev.variety(outputs)
    assert fig["distinct2_mean"] >= 0.5, fig
    assert fig["dominated_share"] <= 0.1, fig
    assert fig["distinct_outputs"] >= 45, fig


@pytest.mark.slow
@pytest.mark.skipif(not (MODELS / "tiny-drafter" / "config.json").is_file(),
                    reason="tiny models not built")
def test_shipped_drafter_drafts_the_unusual_slice_worse_than_code() -> None:
    """Measured live on the shipped (bf16) weights: the target was taught text its drafter
    never saw (license texts, German, Spanish, Japanese), as a deployment's unusual slice is
    text a drafter adapted on everyday traffic has rarely seen."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-target")
    target, drafter = (LlamaForCausalLM.from_pretrained(MODELS / name, dtype=torch.float32).eval()
                       for name in ("tiny-target", "tiny-drafter"))
    prompts = ev.load_prompts(FIXTURES.parent / "prompts" / "pilot.jsonl", tok)
    accept = ev.assisted(target, drafter, tok, prompts, 4, 48).report(prompts)
    assert accept["pooled"] >= 2.5, accept
    assert accept["by_slice"]["unusual"] <= 0.9 * accept["by_domain"]["code"], accept
    assert accept["by_slice"]["unusual"] <= 0.9 * accept["by_slice"]["core"], accept
