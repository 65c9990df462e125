"""pytest-osprey: decide in CI, with evidence, whether a speculative-decoding drafter may ship."""

__version__ = "0.1.0"
