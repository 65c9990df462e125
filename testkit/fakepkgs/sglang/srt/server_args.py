"""Fake ``prepare_server_args``: a strict parser of the flags osprey generates, and a
``resolve_once`` that refuses what SGLang 0.5.23 refuses at launch for those flags."""

from __future__ import annotations

import argparse
import os

_VALUE = [
    "--model-path", "--host", "--port", "--dtype", "--tp-size", "--mem-fraction-static",
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--api-key", "--config",
    "--max-running-requests",
]  # fmt: skip
_FLAGS = ["--enable-deterministic-inference", "--enable-metrics",
          "--incremental-streaming-output", "--speculative-use-rejection-sampling"]


class ServerArgs(argparse.Namespace):
    speculative_algorithm: str | None
    speculative_use_rejection_sampling: bool

    def resolve_once(self) -> None:
        """As SGLang's speculative resolution (rejection sampling: EAGLE/EAGLE3 only); with
        OSPREY_FAKE_NO_ACCELERATOR set, as a machine without the deployment's GPU."""
        if os.environ.get("OSPREY_FAKE_NO_ACCELERATOR"):
            raise RuntimeError("No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform "
                               "plugin is available.")
        algorithm = (self.speculative_algorithm or "").upper()
        if self.speculative_use_rejection_sampling and algorithm not in ("EAGLE", "EAGLE3"):
            raise NotImplementedError(
                "--speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / "
                f"NEXTN, not speculative_algorithm={algorithm}.")

    def check_server_args(self) -> None:
        pass


def prepare_server_args(argv: list[str]) -> ServerArgs:
    p = argparse.ArgumentParser(prog="sglang serve")
    for name in _VALUE:
        p.add_argument(name)
    for name in _FLAGS:
        p.add_argument(name, action="store_true")
    args = p.parse_args(argv, namespace=ServerArgs())
    if args.config is not None:  # as SGLang: a YAML file whose keys are flags
        import json

        with open(args.config, encoding="utf-8") as fh:
            for key, value in json.load(fh).items():
                setattr(args, key.replace("-", "_"), value)
    return args
