"""What the pytest entry point costs every pytest run where the plugin is installed.

Runs ``python -X importtime -c "import pytest_osprey.plugin"`` a few times and prints the
cumulative import time of ``pytest_osprey.plugin`` (best of the runs, in ms), what it imported,
and the load average beside it (the machine may be shared). The target: at most 50 ms, and none
of numpy, scipy, torch, transformers, matplotlib (tests/test_layout.py checks the latter).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

RUNS = 7


def cumulative_us() -> tuple[int, list[str]]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import pytest_osprey.plugin"],
                         capture_output=True, text=True, check=True).stderr
    rows = [m.groups() for m in re.finditer(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", out)]
    total = next(int(cum) for _, cum, _, name in rows if name == "pytest_osprey.plugin")
    return total, [name for _, _, indent, name in rows if name.startswith("pytest_osprey")]


def main() -> None:
    best = min(cumulative_us()[0] for _ in range(RUNS))
    _, ours = cumulative_us()
    print(f"import pytest_osprey.plugin: {best / 1000:.1f} ms cumulative (best of {RUNS}); "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"package modules imported: {', '.join(ours)}")


if __name__ == "__main__":
    main()
