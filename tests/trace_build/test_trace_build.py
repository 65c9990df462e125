"""`trace build`: every source format read into a valid trace, malformed sources refused in
one line (exit 4, nothing written), the sample's domain shares and its lack of order bias,
near-duplicates collapsed, personal data masked, budgets from logged completions, and the
shipped trace rebuilt through the builder."""

from __future__ import annotations

import csv
import json
import math
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.__main__ import main
from pytest_osprey.pilot.trace import Trace, load_trace
from pytest_osprey.trace_build.dedupe import near_duplicates
from pytest_osprey.trace_build.sampling import allocate, stratified_sample
from testkit.factories import ROOT

PILOT = ROOT / "prompts" / "pilot.jsonl"
TOKENIZER = ROOT / "fixtures" / "models" / "tiny-target"


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def build(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["trace", "build", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def summary_of(trace: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(trace.with_name(trace.stem + ".summary.json").read_text())
    return data


def estimate(text: str) -> int:
    return math.ceil(len(text) / 4)


# ----------------------------------------------------------------------- formats


def test_openai_chat_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reply = "Paris is the capital of France, and has been for centuries."
    src = jsonl(tmp_path / "logs.jsonl", [
        {"request": {"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"}]},
         "response": {"choices": [{"message": {"role": "assistant", "content": reply}}]},
         "user": "u-991", "timestamp": "2026-01-02T03:04:05Z"},
        {"messages": [{"role": "developer", "content": "You write SQL."},
                      {"role": "user", "content": [{"type": "text", "text": "Count rows "},
                                                   {"type": "text", "text": "in t."}]},
                      {"role": "assistant", "content": "SELECT COUNT(*) FROM t;"}]},
        {"request": {"messages": [{"role": "user", "content": "Summarise our refund policy."}]},
         "response": {"choices": [{"message": {"role": "assistant", "content": None}}],
                      "usage": {"prompt_tokens": 9, "completion_tokens": 87}}},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user", "content": "Weather?"},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
    ])
    out = tmp_path / "t.jsonl"
    code, stdout, err = build(capsys, src, "--out", out)
    assert code == 0, err
    prompts = load_trace([out]).prompts
    assert len(prompts) == 3
    by_text = {p.messages[-1]["content"]: p for p in prompts if p.messages}
    paris = by_text["What is the capital of France?"]
    assert paris.messages is not None and paris.messages[0]["role"] == "system"
    assert paris.max_new_tokens == estimate(reply)
    sql = by_text["Count rows in t."]
    assert sql.messages is not None and sql.messages[0] == {"role": "system",
                                                            "content": "You write SQL."}
    assert sql.max_new_tokens == estimate("SELECT COUNT(*) FROM t;")
    assert by_text["Summarise our refund policy."].max_new_tokens == 87  # the logged usage
    summary = summary_of(out)
    assert summary["budgets"] == {"from completion": 2, "from usage": 1}
    assert summary["sources"] == [{"file": str(src), "format": "openai"}]
    assert {d["reason"]: d["count"] for d in summary["dropped"]} == {
        "non-text content (image_url)": 1, "tool calls": 1}
    assert summary["dropped"][0]["first"][0].startswith(f"{src}:")
    # Nothing the trace format does not have is carried: no user, no timestamp.
    text = out.read_text() + json.dumps(summary)
    assert "u-991" not in text and "2026-01-02" not in text
    assert "wrote 3 prompts" in stdout


def test_sharegpt_json_and_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conv = [{"id": "abc", "conversations": [
        {"from": "human", "value": "Write a haiku about rain."},
        {"from": "gpt", "value": "Soft rain on the roof / ..."},
        {"from": "human", "value": "Now one about snow."},
        {"from": "gpt", "value": "White hush on the pines, falling without a sound."}]},
        {"id": "only-gpt", "conversations": [{"from": "gpt", "value": "Hello!"}]}]
    arr = tmp_path / "share.json"
    arr.write_text("[\n" + ",\n".join(json.dumps(c) for c in conv) + "\n]\n", encoding="utf-8")
    lines = jsonl(tmp_path / "share.jsonl", [
        {"conversations": [{"from": "human", "value": "Translate 'cat' into German."},
                           {"from": "gpt", "value": "Katze"}]}])
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, arr, lines, "--out", out)
    assert code == 0, err
    prompts = {p.messages[-1]["content"]: p for p in load_trace([out]).prompts if p.messages}
    snow = prompts["Now one about snow."]
    assert snow.messages is not None and len(snow.messages) == 3
    assert snow.max_new_tokens == estimate("White hush on the pines, falling without a sound.")
    assert prompts["Translate 'cat' into German."].max_new_tokens == estimate("Katze")
    summary = summary_of(out)
    assert [s["format"] for s in summary["sources"]] == ["sharegpt", "sharegpt"]
    assert summary["dropped"] == [{"reason": "no user turn", "count": 1,
                                   "first": [f"{arr}:3"]}]


def test_csv_columns_and_references(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "eval.csv"
    with src.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["question", "topic", "answer", "model_output", "customer"])
        w.writerow(["What is 12 times 12?", "math", "144", "12 x 12 = 144", "acme"])
        w.writerow(["Name the largest planet.", "science", "Jupiter", "It is Jupiter.", "acme"])
        w.writerow(["Sum 1,000 and 2,500.", "math", "3,500", "", "acme"])
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--text-field", "question",
                         "--domain-field", "topic", "--reference-field", "answer",
                         "--completion-field", "model_output")
    assert code == 0, err
    prompts = {p.prompt: p for p in load_trace([out]).prompts}
    assert prompts["What is 12 times 12?"].expect == {"type": "number", "value": 144,
                                                      "tolerance": 0}
    assert prompts["What is 12 times 12?"].max_new_tokens == estimate("12 x 12 = 144")
    assert prompts["Sum 1,000 and 2,500."].expect == {"type": "number", "value": 3500,
                                                      "tolerance": 0}
    assert prompts["Sum 1,000 and 2,500."].max_new_tokens is None  # the pilot's default
    planet = prompts["Name the largest planet."]
    assert planet.domain == "science" and planet.expect == {
        "type": "contains", "value": "Jupiter", "case_sensitive": False}
    summary = summary_of(out)
    assert summary["expect"] == {"from reference": 3}
    assert summary["budgets"] == {"from completion": 2, "pilot default": 1}
    assert "acme" not in out.read_text()


def test_tokenizer_counts_budgets_and_cap(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoTokenizer

    long = "word " * 300
    src = jsonl(tmp_path / "p.jsonl", [
        {"prompt": "Say something short.", "completion": "Here is something short."},
        {"prompt": "Say something long.", "completion": long}])
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--tokenizer", TOKENIZER,
                         "--completion-field", "completion", "--max-new-tokens-cap", "100")
    assert code == 0, err
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    want = len(tok("Here is something short.", add_special_tokens=False)["input_ids"])
    budgets = {p.prompt: p.max_new_tokens for p in load_trace([out]).prompts}
    assert budgets == {"Say something short.": want, "Say something long.": 100}
    summary = summary_of(out)
    assert summary["tokenizer"] == str(TOKENIZER)
    assert summary["budgets"] == {"from completion": 1, "capped": 1}
    assert summary["max_new_tokens"]["max"] == 100


# ----------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(("name", "content", "fmt", "message"), [
    ("bad.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n\n{"messages": [\n',
     "auto", "bad.jsonl:3: invalid JSON: Expecting value (column 15)"),
    ("bad.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n'
     '{"messages": [{"role": "robot", "content": "hi"}]}\n',
     "openai", "bad.jsonl:2: messages[0].role 'robot' is not system, user or assistant"),
    ("bad.jsonl", '{"request": {"model": "m"}}\n', "openai",
     "bad.jsonl:1: no 'messages' (an OpenAI chat request log line)"),
    ("bad.json", '[\n  {"conversations": [{"from": "human", "value": "a"}]},\n'
     '  {"conversations": [{"from": "alien", "value": "b"}]}\n]\n', "auto",
     "bad.json:3: conversations[0].from 'alien' is not human, gpt or system"),
    ("bad.json", '[\n  {"conversations": []},\n', "sharegpt",
     "bad.json:2: no 'conversations' array (a ShareGPT record)"),
    ("bad.json", '[\n  {"conversations": [{"from": "human", "value": "a"}]}\n  {"x": 1}\n]',
     "auto", "bad.json:3: invalid JSON: expected ',' or ']' between elements"),
    ("bad.csv", "prompt,domain\nhello,chat\n\"unclosed,chat\n", "auto",
     "bad.csv:3: 1 fields, the header has 2"),
    ("bad.csv", "prompt,domain\nhello,chat,extra\n", "csv",
     "bad.csv:2: 3 fields, the header has 2"),
    ("bad.csv", "text,domain\nhello,chat\n", "csv",
     "bad.csv:1: no column 'prompt' (--text-field); the columns are 'text', 'domain'"),
    ("bad.jsonl", '{"prompt": 42}\n', "jsonl", "bad.jsonl:1: no string 'prompt' (nor 'messages')"),
    ("bad.jsonl", '{"prompt": "a", "expect": {"type": "regex", "pattern": "("}}\n', "jsonl",
     "bad.jsonl:1: expect.pattern does not compile"),
    ("bad.jsonl", "", "auto", "bad.jsonl: empty source file"),
])
def test_malformed_source(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                          content: str, fmt: str, message: str) -> None:
    src = tmp_path / name
    src.write_text(content, encoding="utf-8")
    out = tmp_path / "t.jsonl"
    out.write_text("kept\n", encoding="utf-8")
    code, stdout, err = build(capsys, src, "--out", out, "--format", fmt, "--force")
    assert code == 4
    assert err.startswith(f"error: {tmp_path}/{message}") and err.count("\n") == 1, err
    assert stdout == "" and out.read_text() == "kept\n"  # nothing written over
    assert not (tmp_path / "t.summary.json").exists()


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = jsonl(tmp_path / "p.jsonl", [{"prompt": "Hello there."}])
    out = tmp_path / "t.jsonl"
    out.write_text("kept\n", encoding="utf-8")
    code, _, err = build(capsys, src, "--out", out)
    assert code == 4 and err == f"error: {out}: already exists; give --force to replace it\n"
    for args, msg in ((["--domain-rule", "code"], "--domain-rule 'code': give it as DOMAIN=REGEX"),
                      (["--unusual-rule", "("], "--unusual-rule '(': does not compile"),
                      (["--redact", "email,ssn"], "--redact: unknown pattern 'ssn'"),
                      (["--redact-hook", "nosuchmodule_x:f"], "--redact-hook 'nosuchmodule_x:f'"),
                      (["--tokenizer", str(tmp_path / "none")], "--tokenizer"),
                      (["--size", "0"], "--size 0: needs at least 1"),
                      (["--max-new-tokens-cap", "0"], "--max-new-tokens-cap 0: from 1 to"),
                      (["--near-duplicate", "0"], "--near-duplicate 0: above 0"),
                      (["--default-domain", " "], "--default-domain ' ': a non-empty name")):
        code, _, err = build(capsys, src, "--out", out, "--force", *args)
        assert code == 4 and err.startswith(f"error: {msg}") and err.count("\n") == 1, err
    assert out.read_text() == "kept\n"
    code, _, err = build(capsys, tmp_path / "missing.jsonl", "--out", tmp_path / "u.jsonl")
    assert code == 4 and err == f"error: {tmp_path}/missing.jsonl: no such file\n"


# ----------------------------------------------------------------------- sampling


def domain_source(tmp_path: Path, shares: dict[str, int], seed: int = 3) -> Path:
    """Records grouped by domain (all of the first domain first), each prompt distinct."""
    rng = random.Random(seed)
    rows = []
    for domain, n in shares.items():
        for i in range(n):
            words = " ".join(rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(2, 6)
                             for _ in range(12))
            rows.append({"prompt": f"{domain} request {i}: {words}", "domain": domain})
    return jsonl(tmp_path / "src.jsonl", rows)


def test_domain_shares_follow_the_source(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    shares = {"chat": 500, "code": 300, "math": 150, "legal": 50}
    src = domain_source(tmp_path, shares)
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--size", "60", "--domain-field", "domain",
                         "--unusual-domains", "legal", "--seed", "11")
    assert code == 0, err
    trace = load_trace([out])
    got = Counter(p.domain for p in trace.prompts)
    total = sum(shares.values())
    for domain, n in shares.items():  # largest remainders: within one prompt of its share
        assert abs(got[domain] - 60 * n / total) < 1
    assert {p.slice for p in trace.prompts if p.domain == "legal"} == {"unusual"}
    # Written interleaved: the unusual slice is not left to the end of the file.
    positions = [i for i, p in enumerate(trace.prompts) if p.slice == "unusual"]
    assert positions[0] < len(trace.prompts) // 2
    # A random draw in each domain, not its first prompts (the source is in order).
    index = [int(p.prompt.split(":")[0].split()[-1]) for p in trace.prompts
             if p.domain == "chat" and p.prompt]
    assert sorted(index) != list(range(len(index)))
    rows = {r["domain"]: r for r in summary_of(out)["strata"]}
    assert rows["chat"]["eligible"] == 500 and rows["chat"]["sampled"] == got["chat"]
    # The same seed gives the same trace; another seed another sample.
    again = tmp_path / "again.jsonl"
    build(capsys, src, "--out", again, "--size", "60", "--domain-field", "domain",
          "--unusual-domains", "legal", "--seed", "11")
    assert load_trace([again]).sha256 == trace.sha256
    other = tmp_path / "other.jsonl"
    build(capsys, src, "--out", other, "--size", "60", "--domain-field", "domain",
          "--unusual-domains", "legal", "--seed", "12")
    assert load_trace([other]).sha256 != trace.sha256


def test_rules_and_unusual_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ([{"prompt": f"def f{i}(x): return x + {i}  # explain this"} for i in range(40)]
            + [{"prompt": f"Draft clause {i} of the lease on subletting, {i} months notice"}
               for i in range(10)]
            + [{"prompt": f"Plan day {i} of a trip to {c}"} for i, c in
               enumerate(["Rome", "Oslo", "Lima", "Pune", "Kyiv"] * 10)])
    src = jsonl(tmp_path / "src.jsonl", rows)
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--size", "20", "--near-duplicate", "1",
                         "--domain-rule", r"code=\bdef\b", "--domain-rule", "legal=(?i)clause",
                         "--unusual-rule", "(?i)lease", "--unusual-share", "0.25")
    assert code == 0, err
    got = Counter((p.slice, p.domain) for p in load_trace([out]).prompts)
    # A quarter unusual; the rest split 40:50 (6.7 and 8.3, largest remainders).
    assert got == {("unusual", "legal"): 5, ("core", "code"): 7, ("core", "general"): 8}


def test_ids_unique_across_slices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"prompt": f"Question {i}: {w} {w} {w}", "topic": t} for i, (w, t) in enumerate(
        [("tide", "Legal"), ("moss", "legal"), ("reef", "legal"), ("lava", "Legal"),
         ("fern", "général"), ("kelp", "général")])]
    src = jsonl(tmp_path / "src.jsonl", rows)
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--domain-field", "topic",
                         "--unusual-rule", "tide|moss")
    assert code == 0, err
    trace = load_trace([out])  # would refuse a repeated id
    assert sorted(p.id for p in trace.prompts) == [
        "général-01", "général-02", "legal-01", "legal-02", "legal-03", "legal-04"]
    assert Counter(p.slice for p in trace.prompts) == {"core": 4, "unusual": 2}


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_built_trace_is_interleaved_not_grouped_by_domain(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Anything that reads the head of a built trace sees every domain, in every seed: its
    first 8 lines are never one domain, and each domain's lines spread over the file."""
    shares = {"chat": 300, "code": 100, "math": 60, "legal": 40}
    src = domain_source(tmp_path, shares)
    heads = []
    for seed in range(8):
        out = tmp_path / f"t{seed}.jsonl"
        code, _, err = build(capsys, src, "--out", out, "--size", "40", "--domain-field",
                             "domain", "--unusual-domains", "legal", "--seed", str(seed))
        assert code == 0, err
        prompts = load_trace([out]).prompts
        head = [p.domain for p in prompts[:8]]
        heads.append(tuple(head))
        assert len(set(head)) >= 3, head  # chat is 60%: about 5 of 8, never all
        # Each domain's prompts spread over the file: its mean position near the middle.
        for domain in shares:
            where = [i for i, p in enumerate(prompts) if p.domain == domain]
            assert abs(sum(where) / len(where) - (len(prompts) - 1) / 2) < len(prompts) / 6
        # Both slices within the first half.
        assert {p.slice for p in prompts[:20]} == {"core", "unusual"}
    assert len(set(heads)) > 1  # the order is seeded


def test_first_n_bias_against_the_sample() -> None:
    """A source sorted easy to hard: its first N understate difficulty badly; the builder's
    sample is within noise of the truth on average over seeds."""
    n, size = 4000, 50
    rng = random.Random(5)
    difficulty = [i / n + rng.gauss(0, 0.1) for i in range(n)]
    truth = sum(difficulty) / n
    first = sum(difficulty[:size]) / size
    strata = {("core", "a"): list(range(0, n, 2)), ("core", "b"): list(range(1, n, 2))}
    means = []
    for seed in range(100):
        picked = [i for m in stratified_sample(strata, size, seed).values() for i in m]
        assert len(picked) == size
        means.append(sum(difficulty[i] for i in picked) / size)
    mean = sum(means) / len(means)
    sd = (sum((m - mean) ** 2 for m in means) / (len(means) - 1)) ** 0.5
    assert truth - first > 0.4  # first-N is far off
    assert abs(mean - truth) < 3 * sd / len(means) ** 0.5 + 0.005  # unbiased
    assert sd < 0.06  # one sample is near the truth too (sd of a mean of 50)


def test_allocate_respects_sizes() -> None:
    assert allocate({("core", "a"): 7, ("core", "b"): 3}, 5) == {("core", "a"): 4,
                                                                 ("core", "b"): 1}
    assert allocate({("core", "a"): 2, ("core", "b"): 1}, 9) == {("core", "a"): 2,
                                                                 ("core", "b"): 1}


# ----------------------------------------------------------------------- near-duplicates


def test_shuffled_near_duplicate_collapses(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(2)
    base = ("Please summarise the quarterly revenue figures for the northern region and flag "
            "any month where costs exceeded the budget by more than five percent")
    words = base.split()
    rng.shuffle(words)
    shuffled = " ".join(words).replace("northern", "Northern") + " please"
    rows = [{"prompt": f"Unrelated question number {i} about {t}"} for i, t in
            enumerate(["birds", "cars", "tea", "maps", "jazz", "glue", "rain", "ice"])]
    rows.insert(1, {"prompt": base})
    rows.append({"prompt": shuffled})  # far from the original, words shuffled, one added
    src = jsonl(tmp_path / "src.jsonl", rows)
    out = tmp_path / "t.jsonl"
    code, stdout, err = build(capsys, src, "--out", out)
    assert code == 0, err
    texts = [p.prompt for p in load_trace([out]).prompts]
    assert base in texts and shuffled not in texts and len(texts) == 9
    drops = summary_of(out)["dropped"]
    assert drops == [{"reason": "near-duplicate", "count": 1,
                      "first": [f"{src}:10 (of {src}:2)"]}]
    assert "dropped 1: near-duplicate" in stdout


def test_near_duplicates_at_scale() -> None:
    rng = random.Random(9)
    vocab = [f"w{i}" for i in range(3000)]
    texts = [" ".join(rng.choices(vocab, k=30)) for _ in range(3000)]
    planted = {}
    for k in range(0, 3000, 300):
        words = texts[k].split()
        rng.shuffle(words)
        words[0] = "changed"
        texts.append(" ".join(words))
        planted[len(texts) - 1] = k
    assert near_duplicates(texts, 0.8) == planted


# ----------------------------------------------------------------------- privacy


def test_redaction_patterns_and_hook(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mask_names.py").write_text(
        "def mask(text):\n    return text.replace('Ingrid Svensson', '<NAME>')\n",
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    secret = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0kLmN"
    src = jsonl(tmp_path / "logs.jsonl", [
        {"messages": [{"role": "user", "content": f"I am Ingrid Svensson, mail me at "
                       f"ingrid.s@example.com or call +46 70 123 45 67; my key is {secret}."}],
         "completion": "Sure."},
        {"prompt": "Our Q3 revenue was 4,200,000 on 2026-03-15; call (555) 123-4567.",
         "completion": "Noted."}])
    out = tmp_path / "t.jsonl"
    code, stdout, err = build(capsys, src, "--out", out, "--format", "jsonl",
                              "--redact-hook", "mask_names:mask")
    assert code == 0, err
    text = out.read_text()
    for leaked in ("Ingrid", "ingrid.s@example.com", "+46 70", secret, "123-4567"):
        assert leaked not in text
    assert "<NAME>" in text and "<EMAIL>" in text and "<API_KEY>" in text
    assert text.count("<PHONE>") == 2 and "4,200,000 on 2026-03-15" in text
    assert summary_of(out)["redacted"] == {"hook": 1, "api_key": 1, "email": 1, "phone": 2}
    assert "redacted: " in stdout
    (tmp_path / "bad_hook.py").write_text("def mask(text):\n    return None\n", encoding="utf-8")
    code, _, err = build(capsys, src, "--out", out, "--format", "jsonl", "--force",
                         "--redact-hook", "bad_hook:mask")
    assert code == 4 and err == "error: redaction hook bad_hook:mask returned NoneType, not str\n"
    assert out.read_text() == text
    code, _, _ = build(capsys, src, "--out", out, "--format", "jsonl", "--force",
                       "--redact", "none")
    assert code == 0 and "ingrid.s@example.com" in out.read_text()
    sys.modules.pop("mask_names", None)
    sys.modules.pop("bad_hook", None)


# ----------------------------------------------------------------------- the shipped trace


def test_shipped_trace_rebuilt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pilot.jsonl"
    code, _, err = build(capsys, PILOT, "--out", out, "--domain-field", "domain",
                         "--unusual-domains", "legal,clinical,multilingual")
    assert code == 0, err
    shipped, rebuilt = load_trace([PILOT]), load_trace([out])

    def contents(trace: Trace) -> Counter[str]:
        return Counter(json.dumps({k: v for k, v in p.content().items() if k != "id"},
                                  sort_keys=True) for p in trace.prompts)

    assert contents(rebuilt) == contents(shipped)  # every prompt, unmasked, undeduplicated
    summary = summary_of(out)
    assert summary["slices"] == {"core": 40, "unusual": 10}
    assert summary["expect"] == {"carried": 33} and summary["dropped"] == []
    assert summary["redacted"] == {}


# ----------------------------------------------------------------------- near-duplicates: recall


def _pair(rng: random.Random, vocab: list[str], size: int, changed: int) -> tuple[str, str]:
    """Two texts of ``size`` distinct words with ``changed`` of them replaced: Jaccard
    (size - changed) / (size + changed) exactly."""
    words = rng.sample(vocab, size + changed)
    a, b = words[:size], words[:size - changed] + words[size:]
    rng.shuffle(b)
    return " ".join(a), " ".join(b)


def test_near_duplicate_recall_and_no_collapse_below() -> None:
    """Planted pairs at a threshold of 0.82: at least 99% of pairs at J 0.835 collapse
    (MinHash recall, then the exact check), none at J 0.786."""
    from pytest_osprey.trace_build.dedupe import jaccard

    rng = random.Random(12)
    vocab = [f"w{i}" for i in range(50_000)]
    texts: list[str] = []
    close: dict[int, int] = {}
    far: list[int] = []
    for k in range(600):
        a, b = _pair(rng, vocab, 100, 9 if k % 2 == 0 else 12)  # J 91/109, 88/112
        texts += [a, b]
        (close.__setitem__(len(texts) - 1, len(texts) - 2) if k % 2 == 0
         else far.append(len(texts) - 1))
    found = near_duplicates(texts, 0.82)
    caught = {j: found[j] for j in close if j in found}
    assert len(caught) >= 0.99 * len(close) and all(caught[j] == close[j] for j in caught)
    assert len(close) == 300 and all(j not in found for j in far)
    sets = [set(t.split()) for t in texts]
    assert all(jaccard(sets[j], sets[k]) >= 0.82 for j, k in found.items())


@pytest.mark.slow  # over a second on 2 busy cores
def test_default_threshold_recall_at_082_none_at_078() -> None:
    """At the default threshold (0.8): pairs at J 0.82 exactly (91 words, 9 replaced) are
    candidates at least 99.5% of the time by the band layout, and nearly all collapse here;
    pairs at J 0.78 exactly (89 words, 11 replaced) never do."""
    from scipy.stats import binom

    from pytest_osprey.trace_build.build import BuildOptions
    from pytest_osprey.trace_build.dedupe import bands_for

    threshold = BuildOptions.near_duplicate
    bands, rows, agree = bands_for(threshold)
    assert binom.sf(agree - 1, bands, 0.82 ** rows) >= 0.995
    rng = random.Random(14)
    vocab = [f"w{i}" for i in range(50_000)]
    texts: list[str] = []
    close: list[int] = []
    for k in range(1000):
        a, b = _pair(rng, vocab, 91, 9) if k % 2 == 0 else _pair(rng, vocab, 89, 11)
        texts += [a, b]
        if k % 2 == 0:
            close.append(len(texts) - 1)
    found = near_duplicates(texts, threshold)
    caught = sum(1 for j in close if found.get(j) == j - 1)
    # 500 pairs at a recall of 0.995: 2.3 misses expected, more than 7 one time in 500.
    assert caught >= 493, caught
    assert set(found) <= set(close)


def test_one_word_edit_collapses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ("Write the {} for the finance team covering revenue, costs, headcount and the "
            "forecast for next quarter, with a short summary at the top for executives")
    rows = [{"prompt": base.format("report")}, {"prompt": base.format("monthly")}]
    rows += [{"prompt": f"Unrelated question {i} about {t}"} for i, t in
             enumerate(["birds", "cars", "tea", "maps"])]
    src = jsonl(tmp_path / "src.jsonl", rows)
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out)
    assert code == 0, err
    assert len(load_trace([out]).prompts) == 5
    assert summary_of(out)["dropped"][0]["first"] == [f"{src}:2 (of {src}:1)"]


def test_chains_do_not_collapse_transitively() -> None:
    """A chain of one-word edits: each record is dropped only as a copy of a kept record it
    is within the threshold of, so links far from the first are kept."""
    from pytest_osprey.trace_build.dedupe import jaccard

    words = [f"v{i}" for i in range(40)]
    chain = [" ".join(words)]
    for step in range(12):
        words = list(words)
        words[step] = f"edit{step}"
        chain.append(" ".join(words))
    found = near_duplicates(chain, 0.8)
    sets = [set(t.split()) for t in chain]
    assert found and all(jaccard(sets[j], sets[k]) >= 0.8 for j, k in found.items())
    kept = [i for i in range(len(chain)) if i not in found]
    assert len(kept) >= 3  # a transitive grouping would keep one
    # Every record is either kept or within the threshold of a kept, earlier one.
    assert all(found[j] in kept and found[j] < j for j in found)


@pytest.mark.slow  # over a second on 2 busy cores
def test_templated_traffic_is_not_compared_pairwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 prompts sharing a 21-word instruction (J about 0.45 to each other): exact
    comparisons stay near the number of prompts, not its square, and none collapses."""
    from pytest_osprey.trace_build import dedupe

    calls = [0]
    exact = dedupe.jaccard

    def counted(a: set[str], b: set[str]) -> float:
        calls[0] += 1
        return exact(a, b)

    monkeypatch.setattr(dedupe, "jaccard", counted)
    rng = random.Random(8)
    vocab = [f"term{i}" for i in range(20_000)]
    template = ("You are a support assistant for our company; answer the customer's "
                "question below politely, briefly and only from the documents provided:")
    texts = [template + " " + " ".join(rng.sample(vocab, 14)) for _ in range(3000)]
    texts.append(texts[10] + " thanks")  # one real near-duplicate
    found = dedupe.near_duplicates(texts, 0.8)
    assert found == {3000: 10}
    assert calls[0] < 3 * len(texts)


# ----------------------------------------------------------------------- budgets, n > 1


def test_budgets_from_the_chosen_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An n=2 log's usage counts both choices: the budget is the first choice's own length,
    or, without its text, the total divided by n (said in the summary)."""
    first = "word " * 100
    src = jsonl(tmp_path / "logs.jsonl", [
        {"request": {"n": 2, "messages": [{"role": "user", "content": "Write a poem."}]},
         "response": {"choices": [{"message": {"role": "assistant", "content": first}},
                                  {"message": {"role": "assistant", "content": first * 2}}],
                      "usage": {"completion_tokens": 300}}},
        {"request": {"n": 2, "messages": [{"role": "user", "content": "Write a story."}]},
         "response": {"choices": [{"message": {"role": "assistant", "content": None}},
                                  {"message": {"role": "assistant", "content": None}}],
                      "usage": {"completion_tokens": 500}}},
        {"request": {"messages": [{"role": "user", "content": "Write a song."}]},
         "response": {"choices": [{"message": {"role": "assistant", "content": None}}],
                      "usage": {"completion_tokens": 120}}}])
    out = tmp_path / "t.jsonl"
    code, stdout, err = build(capsys, src, "--out", out)
    assert code == 0, err
    budgets = {p.messages[-1]["content"]: p.max_new_tokens for p in load_trace([out]).prompts
               if p.messages}
    assert budgets == {"Write a poem.": estimate(first), "Write a story.": 250,
                       "Write a song.": 120}
    assert summary_of(out)["budgets"] == {"from completion": 1, "from usage / n": 1,
                                          "from usage": 1}
    assert "1 from usage / n" in stdout


# ----------------------------------------------------------------------- privacy: planted secrets


SECRETS = {
    "card": ["4111 1111 1111 1111", "5555-5555-5555-4444", "378282246310005"],
    "phone": ["070-123 45 67", "020 7946 0958", "06 12 34 56 78", "0701234567", "5551234567",
              "+46 70 123 45 67", "(555) 123-4567", "030 12345678", "0151 12345678",
              "07700 900123", "0044 20 7946 0958", "+4915112345678"],
    "api_key": ["sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "glpat-" + "xY9z2AbCdEfGhIjKlMnO",
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
                "AKIAIOSFODNN7EXAMPLE"],
    "email": ["jörg@müller.de", "anna@café.example.fr", "ops@example.com"],
}
KEPT = ["4111 1111 1111 1112", "1767225600", "2026-03-15", "01/02/2026", "4,200,000", "12:30",
        "da39a3ee5e6b4b0d3255bfef95601890afd80709", "v2.14.0", "order 12345678"]


def test_planted_secrets_are_masked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"prompt": f"Record {i}: please handle {value} today.", "topic": "support"}
            for i, value in enumerate(v for vs in SECRETS.values() for v in vs)]
    rows += [{"prompt": f"Keep {value} as it is, case {i}.", "topic": "support"}
             for i, value in enumerate(KEPT)]
    rows.append({"prompt": "Who owns this ticket?", "topic": "owner@example.com"})
    src = jsonl(tmp_path / "src.jsonl", rows)
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--size", "100", "--domain-field", "topic",
                         "--near-duplicate", "1")
    assert code == 0, err
    text = out.read_text()
    for values in SECRETS.values():
        for value in values:
            assert value not in text, value
    for value in KEPT:
        assert value in text, value
    assert "owner@example.com" not in text
    redacted = summary_of(out)["redacted"]
    # A "+" number that happens to pass the Luhn check is a phone number, not a card.
    assert redacted == {"api_key": 5, "email": 4, "card": 3, "phone": 12}


def test_checks_touched_by_redaction_are_dropped(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    src = jsonl(tmp_path / "src.jsonl", [
        {"prompt": "Where should I send the invoice?", "answer": "Send it to ops@example.com"},
        {"prompt": "What is 6 times 7?", "answer": "42"},
        {"prompt": "Which number do I call?",
         "expect": {"type": "contains", "value": "020 7946 0958"}}])
    out = tmp_path / "t.jsonl"
    code, stdout, err = build(capsys, src, "--out", out, "--reference-field", "answer")
    assert code == 0, err
    checks = {p.prompt: p.expect for p in load_trace([out]).prompts}
    assert checks == {"Where should I send the invoice?": None,
                      "What is 6 times 7?": {"type": "number", "value": 42, "tolerance": 0},
                      "Which number do I call?": None}
    assert summary_of(out)["expect"] == {"from reference": 1, "dropped: redacted": 2}
    assert "2 dropped: redacted" in stdout


# ----------------------------------------------------------------------- inputs and outputs


def test_outputs_never_replace_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = jsonl(tmp_path / "logs.jsonl", [{"prompt": "Hello there."}])
    before = src.read_text()
    for out, msg in ((src, "is one of the sources"), (tmp_path / "." / "logs.jsonl",
                                                      "is one of the sources"),
                     (Path("."), "is a directory"), (Path("/"), "is a directory"),
                     (tmp_path, "is a directory")):
        code, stdout, err = build(capsys, src, "--out", out, "--force")
        assert code == 4 and msg in err and err.count("\n") == 1, err
        assert stdout == ""
    assert src.read_text() == before
    assert not list(tmp_path.glob("*.summary.json")) and not Path("logs.summary.json").exists()
    # The summary beside the trace may not be a source either.
    side = jsonl(tmp_path / "t.summary.json", [{"prompt": "Hi."}])
    code, _, err = build(capsys, side, "--out", tmp_path / "t.jsonl", "--force")
    assert code == 4 and "is one of the sources" in err
    assert side.read_text() == '{"prompt": "Hi."}\n'


SPECIAL = {"fifo": "a FIFO, not a regular file", "/dev/zero": "a device",
           "/dev/urandom": "a device", "truncated.gz": "cannot decompress",
           "data.zst": "zstd-compressed", "utf16.jsonl": "binary data"}


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_special_sources_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 kind: str) -> None:
    import gzip
    import os
    import threading

    line = json.dumps({"prompt": "Hello there, how are you?"}) + "\n"
    if kind == "fifo":
        src = tmp_path / "logs.fifo"
        os.mkfifo(src)
    elif kind.startswith("/dev/"):
        src = Path(kind)
    else:
        src = tmp_path / kind
        src.write_bytes(gzip.compress(line.encode() * 50)[:-30] if kind == "truncated.gz" else
                        b"\x28\xb5\x2f\xfd" + bytes(40) if kind == "data.zst" else
                        line.encode("utf-16-le"))
    result: list[tuple[int, str, str]] = []
    worker = threading.Thread(target=lambda: result.append(
        build(capsys, src, "--out", tmp_path / "t.jsonl")), daemon=True)
    worker.start()
    worker.join(30)
    assert result, f"trace build did not return on {kind}"
    code, _, err = result[0]
    assert code == 4 and err.startswith(f"error: {src}") and SPECIAL[kind] in err, err
    assert err.count("\n") == 1 and not (tmp_path / "t.jsonl").exists()


def test_compressed_sources_read_by_content(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import gzip
    import lzma

    rows = "".join(json.dumps({"prompt": f"Question {i}: {w}"}) + "\n" for i, w in
                   enumerate(["tides", "moss", "reefs", "lava"]))
    (tmp_path / "a.jsonl").write_bytes(gzip.compress(rows.encode()))  # gzip, not named so
    (tmp_path / "b.xz").write_bytes(lzma.compress(rows.replace("Question", "Ask").encode()))
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, tmp_path / "a.jsonl", tmp_path / "b.xz", "--out", out,
                         "--format", "jsonl")
    assert code == 0, err
    assert len(load_trace([out]).prompts) == 8


@pytest.mark.slow  # over a second on 2 busy cores
def test_catastrophic_rule_is_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = jsonl(tmp_path / "p.jsonl", [{"prompt": "a" * 40 + "!"}])
    code, _, err = build(capsys, src, "--out", tmp_path / "t.jsonl",
                         "--domain-rule", "x=(a|aa)+$")
    assert code == 4 and err.startswith("error: --domain-rule '(a|aa)+$': took over 1 s")
    assert err.count("\n") == 1


def test_one_line_json_array(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ShareGPT array on one line: every element read, each named by its line (1)."""
    conv = [{"conversations": [{"from": "human", "value": f"Question {i} about {t} here."},
                               {"from": "gpt", "value": "An answer."}]}
            for i, t in enumerate(["sails", "ropes", "knots"] * 400)]
    conv.append({"conversations": [{"from": "gpt", "value": "No question."}]})
    src = tmp_path / "share.json"
    src.write_text(json.dumps(conv), encoding="utf-8")
    out = tmp_path / "t.jsonl"
    code, _, err = build(capsys, src, "--out", out, "--size", "10")
    assert code == 0, err
    summary = summary_of(out)
    assert summary["records"]["read"] == 1201
    assert summary["dropped"][-1] == {"reason": "no user turn", "count": 1,
                                      "first": [f"{src}:1"]}
