"""vLLM: the booted server and its metrics."""
