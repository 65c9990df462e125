"""An endpoint: a server this run did not start."""
