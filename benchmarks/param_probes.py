"""The sampling-parameters gate's per-parameter verdicts on the embedded engine and the tiny
models: per seed, the baseline's params pass, then a candidate per planted fault (or none);
prints each parameter's status, which parameters each fault got named for, and wall time
beside the load average.

    python benchmarks/param_probes.py --prompts 1 --samples 3 --tokens 10 --seeds 0 1 2 \
        --faults none top_p_ignored top_k_ignored min_p_ignored penalties_dropped
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.engines.base import BootSpec  # noqa: E402
from pytest_osprey.engines.embedded.engine import TransformersEngine  # noqa: E402
from pytest_osprey.engines.embedded.planted_faults import ENV  # noqa: E402
from pytest_osprey.judgement.gates.kinds import GateKind  # noqa: E402
from pytest_osprey.judgement.gates.spec import GateSpec  # noqa: E402
from pytest_osprey.judgement.quality.gates import judge_sampling_params  # noqa: E402
from pytest_osprey.pilot.probes import PARAMETERS  # noqa: E402
from pytest_osprey.pilot.schema import Pilot  # noqa: E402
from pytest_osprey.pilot.trace import load_trace  # noqa: E402
from pytest_osprey.results.folder import SavedCampaign  # noqa: E402
from testkit.factories import TINY_DRAFTER, TINY_TARGET, make_pilot, write_trace  # noqa: E402
from testkit.param_probes import probe_condition  # noqa: E402


def pilot(trace: Path, seed: int, args: argparse.Namespace) -> Pilot:
    return make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 512, "threads": 1},
        conditions={"base": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                             "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        trace={"files": [str(trace)]}, load={"levels": {"low": 1}, "passes": 1},
        sampling={"seed": seed, "params": {"enabled": True, "prompts": args.prompts,
                                           "samples": args.samples,
                                           "max_new_tokens": args.tokens}},
    )  # fmt: skip


def engine(p: Pilot, name: str, tmp: Path) -> TransformersEngine:
    e = TransformersEngine(p, name, BootSpec(name, tmp / "logs"))
    e.start()
    return e


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--faults", nargs="+", default=["none", "top_p_ignored"])
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    trace = write_trace(tmp / "t.jsonl", args.prompts, max_new_tokens=args.tokens)
    prompts = list(load_trace([trace]).prompts)
    spec = GateSpec(GateKind.SAMPLING_PARAMS, "cand", "base")
    named: dict[str, list[str]] = {}
    start = time.monotonic()
    for seed in args.seeds:
        p = pilot(trace, seed, args)
        os.environ.pop(ENV, None)
        base = engine(p, "base", tmp)
        try:
            ref, ref_lines = asyncio.run(probe_condition(base, base, "base", p, prompts,
                                                         args.samples, args.tokens))
            for fault in args.faults:
                if fault == "none":
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = fault
                cand = engine(p, "cand", tmp)
                try:
                    recs, lines = asyncio.run(probe_condition(cand, base, "cand", p, prompts,
                                                              args.samples, args.tokens))
                finally:
                    cand.stop()
                data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}},
                                     [*ref, *recs], scores=[*ref_lines, *lines])
                gate = judge_sampling_params(spec, p, data)
                status = {n: gate.details["parameters"][n]["status"] for n, _ in PARAMETERS}
                wrong = sorted(n for n, s in status.items() if s == "not_honoured")
                named.setdefault(fault, []).append(",".join(wrong) or "-")
                print(f"seed {seed} {fault:18s} {gate.outcome:5s} not honoured: "
                      f"{', '.join(wrong) or 'none'}; others: "
                      f"{sorted(set(s for n, s in status.items() if n not in wrong))}")
        finally:
            base.stop()
    os.environ.pop(ENV, None)
    print("per fault, the parameters named in each seed:")
    for fault, got in named.items():
        print(f"  {fault:18s} {' | '.join(got)}")
    print(f"wall {time.monotonic() - start:.0f} s, load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
