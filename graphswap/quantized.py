"""Placeholder until the multiplier-level work lands (issue 3)."""
