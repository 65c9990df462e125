"""The acceptance suites: what `pytest --osprey-config=pilot.yaml` runs (one test per gate)."""
