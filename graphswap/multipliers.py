"""Placeholder until the multiplier-level work lands (issue 3)."""


def builtin_multipliers():
    return {}


def resolve_multiplier(spec):
    return None
