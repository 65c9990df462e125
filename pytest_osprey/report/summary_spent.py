"""summary.json's `campaign.spent`: what the campaign cost (results/spent.py computes it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpentEntry(BaseModel):
    """What the campaign cost (`campaign.spent`): wall time x devices, priced."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True,
                              populate_by_name=True)  # as every summary.json section

    seconds: float
    """Wall time from start to end, boots included (s)."""
    devices: int
    """Devices held per machine (`cost.devices_per_server`)."""
    machines: int
    """A merged campaign's shards, else 1."""
    device_hours: float
    """seconds / 3600 x devices x machines (merged: an upper bound)."""
    cost: float | None
    """device_hours x `cost.device_hour_price`; null without a price."""
    currency: str
    """`cost.currency`."""
    expected_device_hours: float | None
    """The header's expectation (`size.expected`); null without one."""
