"""Fake SGLang for tests: ``python -m sglang.launch_server`` runs testkit/fake_engine.py."""

__version__ = "0.0.fake"
