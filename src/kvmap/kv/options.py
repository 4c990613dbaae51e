"""Spec-string parts with named options: the shared base of codecs and policies.

A subclass sets ``name`` (its spec-string name) and ``defaults`` (every option it
accepts, with its default); construction rejects any other key with a ValueError
naming it, then calls ``validate()``.
"""
from __future__ import annotations

from typing import Any, ClassVar


class Options:
    name: ClassVar[str] = ""
    kind: ClassVar[str] = "part"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"{self.kind} {self.name!r} has no option {unknown[0]!r}; "
                f"its options are {sorted(self.defaults) or 'none'}")
        self.options = {**self.defaults, **options}
        self.validate()

    def validate(self) -> None:
        """Check ``self.options``; raise ValueError naming the bad option."""

    def __repr__(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items() if v != self.defaults[k])
        return f"{self.name}({opts})" if opts else self.name
