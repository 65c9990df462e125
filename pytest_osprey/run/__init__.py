"""The application layer: one pilot run from its inputs to its folder, and re-judging a saved
campaign."""
