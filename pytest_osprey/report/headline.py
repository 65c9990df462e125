"""A verdict in words: one headline per candidate (at most 160 characters), then its reasons as
short named bullets with a diagnosis where one is known. Used by every report and terminal."""

from __future__ import annotations

from ..judgement import Diagnosis, Reason, Speed

MAX_HEADLINE = 160


def speed_text(s: Speed | None, *, with_load: bool = True) -> str | None:
    if s is None or s.estimate is None:
        return None
    text = f"{s.estimate:.2f}x"
    if s.ci_low is not None and s.ci_high is not None:
        text += f" [{s.ci_low:.2f}, {s.ci_high:.2f}]"
    if s.threshold is not None:
        text += f" vs {s.threshold:.2f}x needed"
    return f"{text} at {s.load}" if with_load and s.load else text


def _total(s: Speed | None) -> str | None:
    if s is None or s.total_time is None:
        return None
    text = f"total time {s.total_time:.2f}x"
    if s.total_low is not None and s.total_high is not None:
        text += f" [{s.total_low:.2f}, {s.total_high:.2f}]"
    return text


def quality_text(d: Diagnosis) -> str:
    """``quality identical`` only when every quality check ran; otherwise what was checked,
    then ``unchecked: sampled distribution, ...``; ``quality unproven: correctness not
    evaluable`` when a quality gate ran but could not have failed."""
    if not d.unchecked:
        return f"quality {d.quality}"
    if d.quality in ("changed", "worse"):  # a failed check outranks one that could not fail
        return f"quality {d.quality}; {unchecked_text(d, lead=False)}"
    if any(u.judged for u in d.unchecked):
        return unchecked_text(d)
    checked = "greedy output identical" if d.quality == "identical" else f"quality {d.quality}"
    return f"{checked}; {unchecked_text(d)}"


def unchecked_text(d: Diagnosis, short: bool = False, lead: bool = True) -> str:
    """The quality checks that did not run: ``quality unproven: correctness not evaluable``
    (``unproven: correctness`` when ``short``) for those whose gate could not have failed,
    ``unchecked: ...`` for those switched off."""
    unproven = [u.check for u in d.unchecked if u.judged]
    off = [u.check for u in d.unchecked if not u.judged]
    said = (f"unproven: {', '.join(unproven)}" if short
            else f"{'quality unproven: ' if lead else ''}{', '.join(unproven)} not evaluable")
    parts = [said] if unproven else []
    parts += [f"unchecked: {', '.join(off)}"] if off else []
    return "; ".join(parts)


def headline(d: Diagnosis, width: int = MAX_HEADLINE) -> str:
    """``KEEP cand: speedup 1.23x [1.10, 1.37] vs 1.10x needed at concurrent, total time
    1.20x, accept 3.17, quality identical``: the optional parts are dropped (total time
    first, then accept length, then quality) and then the speed text shortened until the
    line fits ``width``. The quality checks that did not run are never dropped."""
    head = f"{d.verdict} {d.candidate}: "
    if d.withheld:  # a partial campaign: said before any figure
        head += "INTERRUPTED, no verdict: "
    if d.not_run is not None:  # nothing measured: no speed or quality word to give
        line = head + d.not_run + "; speed and quality not measured"
        return line if len(line) <= width else line[: width - 3] + "..."
    s = d.speed
    speeds = [speed_text(s)]
    if s is not None and s.estimate is not None:
        speeds += [f"{s.estimate:.2f}x" + (f" [{s.ci_low:.2f}, {s.ci_high:.2f}]"
                                           if s.ci_low is not None and s.ci_high is not None
                                           else ""), f"{s.estimate:.2f}x"]
    options = [f"speedup {t}" if t else "speed not judged" for t in speeds]
    extra = [p for p in (
        _total(s), f"accept {d.accept_length:.2f}" if d.accept_length is not None else None,
        quality_text(d)) if p]
    tail = [unchecked_text(d, short=True)] if d.unchecked else []
    for required in options:
        parts = list(extra)
        while True:
            # Once the quality part is dropped, what did not run is still said.
            shown = parts if parts[-1:] == extra[-1:] else [*parts, *tail]
            line = head + ", ".join([required, *shown])
            if len(line) <= width:
                return line
            if not parts:
                break
            parts.pop(0)  # total time, then accept length, then quality
    line = head + ", ".join([options[-1], *tail])
    return line if len(line) <= width else line[: width - 3] + "..."


def reason_line(r: Reason) -> str:
    word = "" if r.outcome == "fail" else f" ({r.outcome})"
    return f"{r.name}{word}: {r.text}"


def bullet_lines(d: Diagnosis, indent: str = "  ") -> list[str]:
    """The reasons, then diagnoses tied to no listed reason, then the quality checks that
    did not run and why, then the next step, as indented lines."""
    out = []
    for r in d.reasons:
        out.append(f"{indent}- {reason_line(r)}")
        if r.diagnosis:
            out.append(f"{indent}  diagnosis: {r.diagnosis}")
    out += [f"{indent}- note: {n}" for n in d.notes]
    out += [f"{indent}- unchecked {u.check}: {u.why}" for u in d.unchecked]
    if d.next_step:
        out.append(f"{indent}- next: {d.next_step}")
    return out
