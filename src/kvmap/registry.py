"""One registry mechanism for every family that is picked by name: codecs, policies,
tier backends, eval tasks, bench backends.

A family declares ``FOO = Registry("foo")`` in a module its members can import without
a cycle (the family's ``base.py``); each member registers itself where it is defined::

    @CODECS.register                # under its ``name`` attribute
    class Int8(Codec): name = "int8"

    @TASKS.register("ppl")          # or under an explicit name
    class PerplexityTask: ...

The family's package ``__init__`` imports its member modules, so importing the family
fills its registry; the spec parser, the CLI, the bench and the report then look names
up here and never keep their own lists. A name registered twice is an error (two members
would silently shadow each other), unless ``replace=True`` says it is meant (tests).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> member of one family, in registration order."""

    def __init__(self, family: str):
        self.family = family
        self._members: dict[str, T] = {}

    @overload
    def register(self, member: T) -> T: ...
    @overload
    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]: ...

    def register(self, member=None, *, replace: bool = False):
        """Register ``member`` under its ``name`` attribute, or return a decorator that
        registers under the given name. Returns the member unchanged."""
        if isinstance(member, str) or member is None:
            explicit = member

            def decorate(obj: T) -> T:
                return self._add(explicit or _name_of(obj, self.family), obj, replace)
            return decorate
        return self._add(_name_of(member, self.family), member, replace)

    def _add(self, name: str, member: T, replace: bool) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.family} registry: name {name!r} must be a non-empty string")
        if name in self._members and self._members[name] is not member and not replace:
            raise ValueError(f"{self.family} {name!r} is already registered "
                             f"({self._members[name]!r}); pass replace=True to override")
        self._members[name] = member
        return member

    def unregister(self, name: str) -> None:
        """Remove ``name`` (test doubles clean up with this)."""
        self._members.pop(name, None)

    def get(self, name: str) -> T:
        """The member registered as ``name``; ValueError naming it and the valid names."""
        try:
            return self._members[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.family} {name!r}; valid: "
                             f"{', '.join(self.names()) or '(none registered)'}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._members)

    def items(self):
        return self._members.items()

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {list(self._members)})"


def _name_of(member: object, family: str) -> str:
    name = getattr(member, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{family} registry: {member!r} has no 'name'; "
                         f"register it as register('NAME')(member)")
    return name
