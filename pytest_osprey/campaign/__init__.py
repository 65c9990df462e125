"""The campaign: boot each condition, warm up, replay the trace, record every request.

Measurement only: it writes records.jsonl and campaign.json and judges nothing (early
stopping is a rule handed in by the run).
"""

from .events import ProgressEvent, StopLook, StopRule
from .runner import Campaign

__all__ = ["Campaign", "ProgressEvent", "StopLook", "StopRule"]
