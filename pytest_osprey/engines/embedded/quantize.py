"""Weight rounding for the embedded engine: a target served from quantized weights.

Each weight matrix is rounded to the format's grid with one scale per output channel (row)
and stored back in the compute dtype, which is what a weight-only quantized deployment
computes with. Norms, biases and other vectors stay exact, as quantized serving keeps them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FP8_E4M3_MAX = 448.0  # largest finite float8 e4m3fn value
INT4_MAX = 7  # symmetric int4: -7..7


def round_weights(model: torch.nn.Module, fmt: str) -> int:
    """Round every 2-D weight of ``model`` in place to ``fmt`` (fp8 | int4); returns how many
    matrices were rounded."""
    import torch

    if fmt not in ("fp8", "int4"):
        raise ValueError(f"unknown quantization {fmt!r}; valid: fp8, int4")
    n = 0
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() != 2:
                continue
            w = param.float()
            amax = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
            if fmt == "fp8":
                scale = amax / FP8_E4M3_MAX
                rounded = (w / scale).to(torch.float8_e4m3fn).float() * scale
            else:
                scale = amax / INT4_MAX
                rounded = torch.round(w / scale).clamp(-INT4_MAX, INT4_MAX) * scale
            param.copy_(rounded.to(param.dtype))
            n += 1
    return n
