"""What a campaign actually cost: its wall time (boots, every pass and the quality passes
included, from campaign.json's start and end) times the devices it held, priced at
``cost.device_hour_price``, beside what the header expected before it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..pilot.schema import Pilot
from .campaign_file import CampaignFile


@dataclass(frozen=True)
class Spent:
    """Wall seconds, the devices held per machine, the machines (a merged campaign's shards,
    each on its own machine) and the price; the header's expectation when it had one."""

    seconds: float
    devices: int
    machines: int
    gpu: bool
    price: float
    currency: str
    expected_device_hours: float | None = None

    @property
    def device_hours(self) -> float:
        """Wall time x devices x machines: for a merged campaign an upper bound (its span
        from the first shard's start to the last one's end, on every machine)."""
        return self.seconds / 3600 * self.devices * self.machines

    @property
    def money(self) -> float | None:
        return self.device_hours * self.price if self.price > 0 else None

    def line(self) -> str:
        """E.g. ``cost: 0.93 GPU-hours (USD 2.33 at 2.50/h): 56 min on 1 device; expected
        1.02``."""
        unit = "GPU-hours" if self.gpu else "device-hours"
        money = (f" ({self.currency} {self.money:,.2f} at {self.price:,.2f}/h)"
                 if self.money is not None else "")
        held = f"{self.devices} device{'s' if self.devices > 1 else ''}"
        if self.machines > 1:
            held += f" x {self.machines} machines"
        expected = (f"; expected {self.expected_device_hours:,.2f}"
                    if self.expected_device_hours is not None else "")
        minutes = self.seconds / 60
        span = f"{minutes / 60:,.1f} h" if minutes >= 60 else f"{minutes:,.1f} min"
        return f"cost: {self.device_hours:,.2f} {unit}{money}: {span} on {held}{expected}"

    def as_dict(self) -> dict[str, Any]:
        """summary.json's ``campaign.spent``."""
        return {"seconds": round(self.seconds, 1), "devices": self.devices,
                "machines": self.machines, "device_hours": round(self.device_hours, 4),
                "cost": None if self.money is None else round(self.money, 4),
                "currency": self.currency,
                "expected_device_hours": self.expected_device_hours}


def campaign_spent(meta: CampaignFile, pilot: Pilot) -> Spent | None:
    """The campaign's cost from ``meta``'s start and end, or None while it runs (or for a
    campaign recorded without them)."""
    if meta.started_at is None or meta.ended_at is None:
        return None
    expected = meta.size.expected if meta.size is not None else None
    target = pilot.target
    return Spent(max(0.0, meta.ended_at - meta.started_at), pilot.cost.devices_per_server,
                 max(1, len(meta.merged)),
                 gpu=target.engine != "transformers" or target.device != "cpu",
                 price=pilot.cost.device_hour_price, currency=pilot.cost.currency,
                 expected_device_hours=expected.device_hours if expected is not None else None)
