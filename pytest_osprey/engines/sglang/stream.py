"""What SGLang's native /generate stream says: the chunks (cumulative or incremental) read into
tokens and text, the finish reason or abort, the logprob margins and top-2 ids, and facts of
/server_info."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..http.stream import cap_text

_REASON_MOST = 100  # characters of a finish reason kept
_MESSAGE_MOST = 500  # characters of an abort message kept


def finish_reason_of(value: Any) -> str | None:
    if isinstance(value, Mapping):
        kind = value.get("type")
        return cap_text(str(kind), _REASON_MOST) if kind is not None else None
    return cap_text(str(value), _REASON_MOST) if value is not None else None


def abort_message(value: Any) -> str:
    """Why SGLang aborted a request (finish_reason {"type": "abort", "message": ...})."""
    message = value.get("message") if isinstance(value, Mapping) else None
    return (f"aborted by the server: {cap_text(str(message), _MESSAGE_MOST)}" if message
            else "aborted by the server")


def margins_of(tops: Any) -> list[float] | None:
    """Top-1 minus top-2 logprob per position from [[logprob, id, text], ...] rows."""
    if not isinstance(tops, list):
        return None
    out = []
    for row in tops:
        try:
            out.append(float(row[0][0]) - float(row[1][0]))
        except (TypeError, IndexError, ValueError, KeyError):
            return None
    return out


def verification_of(info: Mapping[str, Any]) -> str | None:
    """How drafts are verified: None without speculation; "greedy" where SGLang always
    commits the target's argmax (on CPU, whatever the request's temperature); "sampled"
    where temperature > 0 verifies by speculative sampling (greedy at temperature 0)."""
    if not info.get("speculative_algorithm"):
        return None
    return "greedy" if str(info.get("device")) == "cpu" else "sampled"


def top2_ids_of(tops: Any) -> list[list[int]] | None:
    """Top-1 and top-2 token ids per position from the same rows."""
    if not isinstance(tops, list):
        return None
    try:
        return [[int(row[0][1]), int(row[1][1])] for row in tops]
    except (TypeError, IndexError, ValueError, KeyError):
        return None


def max_running_of(info: Mapping[str, Any], state: Mapping[str, Any]) -> int | None:
    """The most requests the server runs at once, as resolved at boot: SGLang 0.5.23 caps
    speculative servers at 48 unless --max-running-requests says otherwise, and leaves a
    plain one at its pool's size; requests beyond the cap queue."""
    per_dp = state.get("effective_max_running_requests_per_dp")
    if isinstance(per_dp, int):
        dp = info.get("dp_size")
        return per_dp * (dp if isinstance(dp, int) and dp > 0 else 1)
    value = info.get("max_running_requests")
    return value if isinstance(value, int) else None


class SGLangStream:
    """One /generate stream read chunk by chunk, in either of SGLang's streaming modes.

    Incremental chunks (``--incremental-streaming-output``, how booted servers run) carry
    only their new ids, text and logprob rows: the work per chunk stays flat. Cumulative
    chunks (an endpoint's default) resend everything so far; they are taken by reference,
    not copied, which is all a client can do about them. ``completion_tokens`` counts every
    token so far in both modes, which tells the two apart.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.pieces: list[str] = []
        self.tops: list[Any] = []
        self.meta: Mapping[str, Any] = {}
        self.count = 0

    def take(self, chunk: Mapping[str, Any]) -> tuple[int, bool]:
        """Read one chunk: (tokens it added, whether it carried text)."""
        meta = chunk.get("meta_info")
        if isinstance(meta, Mapping):
            self.meta = meta
        done = self.meta.get("completion_tokens")
        new_ids = chunk.get("output_ids")
        new_ids = new_ids if isinstance(new_ids, list) else []
        if isinstance(done, int):
            cumulative = len(new_ids) == done and done > 0
        else:
            cumulative = len(new_ids) >= len(self.ids) > 0 and new_ids[: len(self.ids)] == self.ids
        piece = chunk.get("text")
        tops = self.meta.get("output_top_logprobs")
        if cumulative:
            self.ids = new_ids
            self.pieces = [piece] if isinstance(piece, str) else self.pieces
            self.tops = tops if isinstance(tops, list) else self.tops
        else:
            self.ids += new_ids
            if isinstance(piece, str):
                self.pieces.append(piece)
            if isinstance(tops, list):
                self.tops += tops
        n = done if isinstance(done, int) else len(self.ids)
        added = max(0, n - self.count)
        self.count = max(self.count, n)
        return added, bool(piece)
