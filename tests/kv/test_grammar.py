import re

import pytest

from kvmap.kv import grammar
from kvmap.kv.config import KVConfig


@pytest.mark.parametrize("text,expected", [
    ("bf16", [("bf16", {})]),
    ("int8(granularity=token)", [("int8", {"granularity": "token"})]),
    ("streaming_llm(sinks=4,window=1024)+int8",
     [("streaming_llm", {"sinks": 4, "window": 1024}), ("int8", {})]),
    (" h2o(budget=0.2) + int8 + tiers(host=256MiB, disk=2GiB) ",
     [("h2o", {"budget": 0.2}), ("int8", {}), ("tiers", {"host": "256MiB", "disk": "2GiB"})]),
    ("x(flag=true,off=false)", [("x", {"flag": True, "off": False})]),
])
def test_parse(text, expected):
    parts = grammar.parse(text)
    assert [(p.name, p.args) for p in parts] == expected


def test_nested_value():
    (part,) = grammar.parse("int8(scale=static(path=/tmp/s.json),granularity=head)")
    assert part.args["scale"].name == "static"
    assert part.args["scale"].args == {"path": "/tmp/s.json"}
    assert part.args["granularity"] == "head"


@pytest.mark.parametrize("text,fragment", [
    ("", "empty"),
    ("int8(", "expected a name"),
    ("int8(granularity)", "expected '='"),
    ("int8(a=1,a=2)", "given twice"),
    ("int8 int4", "expected '+'"),
    ("int8(a=(1)", "expected ',' or ')'"),
])
def test_syntax_errors_name_the_place(text, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        grammar.parse(text)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as e:
        KVConfig.parse("bf16+nonsense(x=1)")
    assert "nonsense" in str(e.value) and "bf16" in str(e.value)


def test_two_codecs_refused():
    with pytest.raises(ValueError, match="two codec parts"):
        KVConfig.parse("bf16+fp32")


def test_unknown_option_refused():
    with pytest.raises(ValueError, match="no option 'bits'"):
        KVConfig.parse("bf16(bits=4)")


def test_default_codec_is_bf16():
    assert KVConfig.parse("bf16").codec.name == "bf16"
