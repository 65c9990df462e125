"""The embedded engine: the model in this process (transformers and torch), batched,
speculating, stopping."""
