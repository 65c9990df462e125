"""Sharded campaigns: the plan of shards, merging their folders, and the Ray and Kubernetes
launchers."""
