"""The tool's version: one place, read by the build (pyproject), the package and campaign.json."""

__version__ = "0.2.0"
