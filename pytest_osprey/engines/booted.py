"""A server booted here for one condition: what the SGLang and vLLM engines share.

The skeleton is the same for both: read the API key, pick the port, build the command line,
start the process tree and wait for its health route, then load the target's chat tokenizer;
the fingerprint joins the client's facts with the boot's; memory is the process tree's;
stop ends the tree. An engine says only what differs: its command line (and environment),
its client, its health route and the facts it adds.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pytest_osprey.results.records import checked
from pytest_osprey.results.scores import ScoredPosition

from .base import BootSpec, EngineError, GenerationRequest, GenerationResult
from .chat_template import load_chat_tokenizer, template_digest
from .http.stream import bearer
from .process import ServerProcess, api_key_from, choose_port, engine_env, mask_argv
from .scoring import prompt_ids
from .speculation import accept_length_most

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot


class ServerClient(Protocol):
    """The HTTP client of one booted server."""

    async def generate(self, req: GenerationRequest) -> GenerationResult: ...

    async def score(self, prompt: Sequence[int], outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]: ...

    def fingerprint(self) -> dict[str, Any]: ...


ClientT = TypeVar("ClientT", bound=ServerClient)


def server_url(host: str, port: int) -> str:
    """The base URL this machine reaches a server bound to ``host`` at: a wildcard bind is
    reached on loopback, an IPv6 address in brackets."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BootedServer(ABC, Generic[ClientT]):
    """A booted server serving one condition."""

    ENGINE: ClassVar[str]
    """The engine's name, as its fingerprint says it."""
    HEALTH_PATH: ClassVar[str]
    """The route that answers 200 once the server can serve."""

    def __init__(self, pilot: Pilot, condition: str, boot: BootSpec) -> None:
        self.pilot = pilot
        self.condition = condition
        self.boot = boot
        self.server: ServerProcess | None = None
        self.client: ClientT | None = None
        self.argv: list[str] = []  # as recorded: any secret in it masked
        self.tokenizer: Any = None  # the target's, when it has a chat template
        self.prompt_format: str | None = None

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def command(self, env: dict[str, str], key: str | None, port: int) -> list[str]:
        """The server's command line on ``port``; it may add to ``env``, which the server
        gets. ``key`` is the API key (None without one): never to appear in argv."""

    @abstractmethod
    def connect(self, base_url: str, key: str | None) -> ClientT:
        """The client of the server at ``base_url``."""

    def booted(self) -> None:
        """Called once the server is healthy, before the tokenizer loads."""

    def release_boot_secrets(self) -> None:
        """Remove what only the boot needed (a key file): called when the boot ends,
        healthy or not, and again at stop."""

    def served_facts(self) -> dict[str, Any]:
        """What the engine adds to the fingerprint (its resolved settings)."""
        return {}

    def spec_counters(self) -> dict[str, float] | None:
        """The server's speculation counters; None for a server that exposes none."""
        return None

    # ------------------------------------------------------------------ the engine

    def start(self) -> None:
        target = self.pilot.target
        env = engine_env(self.pilot, self.condition, self.boot)
        # The key is this process's to read (the client sends it; the server gets it from
        # the command line or a key file), not something the engine's environment inherits.
        key = api_key_from({**os.environ, **env}, target.api_key_env, "target.api_key_env")
        port = choose_port(target.host, target.port, self.condition)
        secrets = [key] if key else []
        try:
            argv = self.command(env, key, port)
            self.argv = mask_argv(argv, secrets)
            base = server_url(target.host, port)
            self.server = ServerProcess(
                self.condition,
                argv,
                env=env,
                log_path=self.boot.log_dir / f"{self.condition}.log",
                health_url=f"{base}{self.HEALTH_PATH}",
                boot_timeout_s=target.boot_timeout_s,
                secrets=secrets,
                health_headers=bearer(key),
            )
            self.client = self.connect(base, key)
            self.server.start()
        finally:
            self.release_boot_secrets()  # healthy: the server has read them; failed: unneeded
        self.booted()
        # After the boot: a model id the server downloaded is in the local cache by now.
        self.tokenizer, self.prompt_format = load_chat_tokenizer(target.model)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.client is None:
            return GenerationResult.failure(f"condition {self.condition!r}: engine not started")
        return self.checked(request, await self.client.generate(request))

    vocab_size: int | None = None  # a server does not say how wide its logits are

    async def score(self, prompt: str, outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]:
        """The target's raw distribution at every position of ``outputs`` (base.Scorer),
        asked of this server."""
        if self.client is None:
            raise EngineError(f"condition {self.condition!r}: engine not started")
        ids = prompt_ids(self.pilot.target.model, prompt, self.condition)
        return await self.client.score(ids, outputs, top_k)

    def checked(self, request: GenerationRequest, result: GenerationResult) -> GenerationResult:
        """``result``, or a failed request where the server reported what cannot be."""
        return checked(result, request.max_new_tokens,
                       accept_length_most(self.pilot, self.condition))

    def fingerprint(self) -> dict[str, Any]:
        fp: dict[str, Any] = {"engine": self.ENGINE}
        if self.client is not None:
            fp = self.client.fingerprint()
        fp.update(self.served_facts())
        fp["chat_template"] = template_digest(self.tokenizer)
        fp["prompt_format"] = self.prompt_format
        fp["argv"] = self.argv
        if self.server is not None:
            fp["boot_s"] = self.server.boot_s
            fp["pids"] = sorted(self.server.pids())  # lets a test prove the tree is gone
            fp["memory"] = self.server.memory_facts()
            fp["memory_method"] = fp["memory"]["note"]
        return fp

    def memory_mb(self) -> float | None:
        """GPU memory of the server's process tree where NVML sees it, else resident memory."""
        return self.server.memory_mb() if self.server is not None else None

    @abstractmethod
    def flush(self) -> None:
        """Drop the server's caches between passes."""

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.release_boot_secrets()
