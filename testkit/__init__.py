"""Test support shared by tests/ and benchmarks/: factories (records, pilots, campaigns,
traces, tiny models), simulators with a known truth, the scriptable fake server and the fake
engines it plays, and whole pilot runs. Not shipped: it imports pytest_osprey, never the
reverse, and never tests/ or benchmarks/.

Importable from a checkout: the root conftest.py's folder is on sys.path under pytest, and
the benchmarks put the checkout on sys.path before importing it.
"""
