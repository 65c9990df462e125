"""Launchers: thin adapters that run a pilot's shards on machinery that already exists."""
