"""Settings as frozen dataclasses, made from the plain dicts that YAML configs and checkpoints store (`coerce`).
Standard library only: the tokenizers and the papers' model configs use it without importing Lightning."""

from __future__ import annotations

from dataclasses import fields


def coerce(cls, value):
    """A dataclass from a dict (configs and checkpoints store plain dicts)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        names = {f.name for f in fields(cls)}
        unknown = set(value) - names
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
    raise TypeError(f"expected {cls.__name__} or dict, got {type(value).__name__}")
