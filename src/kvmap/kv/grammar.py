"""The KV spec string grammar.

    spec  := part ("+" part)*
    part  := name [ "(" key=value ("," key=value)* ")" ]
    value := number | true | false | size (256MiB) | word | part   (nested, e.g. static(path=x))

Examples: ``bf16``, ``int8(granularity=token)``,
``streaming_llm(sinks=4,window=1024)+int8``, ``h2o(budget=0.2)+int8+tiers(host=256MiB)``.

This module only parses text into :class:`Part` values; what a name means lives in the
codec, policy and tier registries (``kvmap.kv.config``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class Part:
    name: str
    args: dict = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.args:
            return self.name
        inner = ",".join(f"{k}={_format_value(v)}" for k, v in self.args.items())
        return f"{self.name}({inner})"


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class SpecSyntaxError(ValueError):
    pass


def parse(text: str) -> list[Part]:
    """Parse a spec string into its parts; raises SpecSyntaxError naming the bad place."""
    if not isinstance(text, str) or not text.strip():
        raise SpecSyntaxError(f"KV spec {text!r} is empty")
    parser = _Parser(text)
    parts = [parser.part()]
    while parser.peek() == "+":
        parser.pos += 1
        parts.append(parser.part())
    parser.skip_ws()
    if parser.pos != len(text):
        raise parser.error("expected '+' or the end of the spec")
    return parts


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def error(self, msg: str) -> SpecSyntaxError:
        pointer = self.text[: self.pos] + " <here> " + self.text[self.pos:]
        return SpecSyntaxError(f"bad KV spec {self.text!r}: {msg} at position {self.pos} "
                               f"({pointer.strip()!r})")

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def name(self) -> str:
        self.skip_ws()
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error("expected a name")
        self.pos = m.end()
        return m.group(0)

    def part(self) -> Part:
        name = self.name()
        args: dict = {}
        if self.peek() == "(":
            self.pos += 1
            if self.peek() == ")":
                self.pos += 1
                return Part(name, args)
            while True:
                key = self.name()
                if self.peek() != "=":
                    raise self.error(f"expected '=' after {key!r}")
                self.pos += 1
                if key in args:
                    raise self.error(f"option {key!r} given twice")
                args[key] = self.value()
                nxt = self.peek()
                self.pos += 1
                if nxt == ")":
                    break
                if nxt != ",":
                    self.pos -= 1
                    raise self.error("expected ',' or ')'")
        return Part(name, args)

    def value(self):
        self.skip_ws()
        start = self.pos
        depth = 0
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "(":
                depth += 1
            elif ch == ")":
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                break
            self.pos += 1
        raw = self.text[start:self.pos].strip()
        if not raw:
            raise self.error("expected a value")
        if depth:
            raise self.error("unbalanced parentheses")
        return convert_value(raw)


def convert_value(raw: str):
    """'true' -> True, '4' -> 4, '0.25' -> 0.25, 'static(path=x)' -> Part, else the string."""
    low = raw.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        pass
    if _NAME.match(raw) and raw.endswith(")") and "(" in raw:
        parts = parse(raw)
        if len(parts) == 1:
            return parts[0]
    return raw
