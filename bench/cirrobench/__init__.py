"""`cirro bench`: Cirro's benchmark harness (see bench/README.md)."""
