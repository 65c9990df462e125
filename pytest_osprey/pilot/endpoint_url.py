"""An endpoint's base URL, checked when the pilot is read: the run talks HTTP to it, so a URL
that is not one (``file:///etc/passwd``, ``javascript:...``, ``not a url``, ``http://[::1``)
or that carries credentials is refused with the reason, before anything runs."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")


def check_url(url: str) -> str:
    """``url`` if it is an http(s) base URL with a host and a valid port; else ValueError
    with a plain reason."""
    if _SPACE_OR_CONTROL.search(url):
        raise ValueError("the URL contains spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when not a number or out of 0-65535
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        shown = f"{parts.scheme}:" if parts.scheme else "none"
        raise ValueError(f"the scheme must be http or https (got {shown}), "
                         "e.g. http://127.0.0.1:30000")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not carry a user or password: give the key through "
                         "api_key_env")
    if not parts.hostname:
        raise ValueError("the URL has no host, e.g. http://127.0.0.1:30000")
    if port == 0:
        raise ValueError("port 0 is not a server's port")
    if parts.query or parts.fragment:
        raise ValueError("a base URL has no query (?...) or fragment (#...)")
    return url
