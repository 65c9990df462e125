"""Did the outputs stay as good: greedy identity, task correctness, sampled distributions,
sampling parameters honoured and acceptance health."""
