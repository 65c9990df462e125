"""The EAGLE-3 draft bodies SGLang serves, and those it needs a drafter's own patch for
(multi-layer drafts, Osprey's own embedding and swapped input): shared by the artifact check,
which reads a draft's config, and the serving check run in the engine's environment."""

from __future__ import annotations

from dataclasses import dataclass

# EAGLE-3 draft classes stock SGLang does not ship, served by an SGLang a drafter's own patch was
# applied to: the class and the module the patch adds (its import is how the patch is verified).
PATCHED_EAGLE3 = {"Qwen3ForCausalLMEagle3": "sglang.srt.models.qwen3_eagle3"}
EAGLE3_MODULES = {"LlamaForCausalLMEagle3": "sglang.srt.models.llama_eagle3", **PATCHED_EAGLE3}
# The SGLang release Osprey's serving patch is written against.
OSPREY_PATCH_SGLANG = "0.5.9"


@dataclass(frozen=True)
class DraftLayout:
    """What an EAGLE-3 draft's config says of its body: the class, its decoder layers, and
    Osprey's marks (``swap_h_and_emb``: its input layer reads [hidden, embedding] in that
    order, and it carries its own tokenizer-aligned ``embed_tokens``)."""

    architecture: str
    layers: int
    swap_h_and_emb: bool

    @property
    def owns_embedding(self) -> bool:
        return self.swap_h_and_emb

    @property
    def needs_patch(self) -> bool:
        """Whether stock SGLang serves it wrong or not at all: a class it lacks, more than
        one layer, or an embedding of its own that SGLang replaces with the target's."""
        return self.architecture in PATCHED_EAGLE3 or self.layers > 1 or self.swap_h_and_emb

    @property
    def module(self) -> str | None:
        return EAGLE3_MODULES.get(self.architecture)

    def describe(self) -> str:
        kind = "Osprey" if self.swap_h_and_emb else "EAGLE-3"
        return f"{self.layers}-layer {kind} draft ({self.architecture})"
