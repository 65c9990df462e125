"""Did the conditions serve alike and completely: completed requests, a fair comparison,
boots alike, memory, latency percentiles and goodput."""
