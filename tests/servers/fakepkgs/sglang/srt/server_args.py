"""Fake ``prepare_server_args``: a strict parser of the flags osprey generates."""

from __future__ import annotations

import argparse

_VALUE = [
    "--model-path", "--host", "--port", "--dtype", "--tp-size", "--mem-fraction-static",
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--api-key", "--config",
]  # fmt: skip
_FLAGS = ["--enable-deterministic-inference", "--enable-metrics"]


def prepare_server_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang")
    for name in _VALUE:
        p.add_argument(name)
    for name in _FLAGS:
        p.add_argument(name, action="store_true")
    args = p.parse_args(argv)
    if args.config is not None:  # as SGLang: a YAML file whose keys are flags
        import json

        with open(args.config, encoding="utf-8") as fh:
            for key, value in json.load(fh).items():
                setattr(args, key.replace("-", "_"), value)
    return args
