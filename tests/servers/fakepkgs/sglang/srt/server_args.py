"""Fake ``prepare_server_args``: a strict parser of the flags osprey generates."""

from __future__ import annotations

import argparse

_VALUE = [
    "--model-path", "--host", "--port", "--dtype", "--tp-size", "--mem-fraction-static",
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--api-key",
]  # fmt: skip
_FLAGS = ["--enable-deterministic-inference", "--enable-metrics"]


def prepare_server_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang")
    for name in _VALUE:
        p.add_argument(name)
    for name in _FLAGS:
        p.add_argument(name, action="store_true")
    return p.parse_args(argv)
