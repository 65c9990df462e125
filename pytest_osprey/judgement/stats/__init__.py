"""General numerics the gates build on (no gate, no record): test outcomes and errors,
non-inferiority of paired binary outcomes, and the loss test."""
