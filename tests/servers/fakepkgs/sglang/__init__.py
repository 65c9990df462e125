"""Fake SGLang for tests: ``python -m sglang.launch_server`` runs tests/servers/fake_server.py."""

__version__ = "0.0.fake"
