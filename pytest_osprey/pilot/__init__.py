"""The pilot and its trace: what to run (schema, loading, prompts), validated before anything
else happens."""

from .loading import load_pilot, load_pilot_unchecked
from .schema import ConfigError, Pilot, json_schema, level_label
from .trace import Prompt, Trace, TraceError, load_trace, render_prompt

__all__ = [
    "ConfigError",
    "Pilot",
    "Prompt",
    "Trace",
    "TraceError",
    "json_schema",
    "level_label",
    "load_pilot",
    "load_pilot_unchecked",
    "load_trace",
    "render_prompt",
]
