"""What was measured, shown beside the gates: per condition and load (latency percentiles,
throughput, accept length, cost) and the reports' analyses (per domain, per draft position)."""

from .measured import Figures, accept_lengths, all_figures, figures_for

__all__ = ["Figures", "accept_lengths", "all_figures", "figures_for"]
