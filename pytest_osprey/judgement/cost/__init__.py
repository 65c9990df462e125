"""Is it worth its cost: cost per request, break-even of a setup cost, and their gates."""
