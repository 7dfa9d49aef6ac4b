"""idem beside the other Python idempotency libraries on one harness: `make bench-peers` (harness.py)."""
