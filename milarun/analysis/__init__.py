"""Results -> summary."""
