"""Is it faster: the time-aware speedup test, its drift check, early stopping, advice for an
inconclusive result, the speed gate, the run-to-run comparison and the machine's stability."""
