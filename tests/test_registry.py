import pytest

from kvmap.registry import Registry


class _A:
    name = "a"


def test_register_by_attribute_and_by_explicit_name():
    reg = Registry("widget")
    assert reg.register(_A) is _A
    reg.register("b")(int)
    assert reg.names() == ("a", "b") and reg.get("b") is int and "a" in reg


def test_unknown_name_lists_valid_ones():
    reg = Registry("widget")
    reg.register(_A)
    with pytest.raises(ValueError, match=r"unknown widget 'zzz'; valid: a"):
        reg.get("zzz")


def test_double_registration_is_refused_unless_replace():
    reg = Registry("widget")
    reg.register(_A)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(int)
    reg.register("a", replace=True)(int)
    assert reg.get("a") is int
    reg.unregister("a")
    assert "a" not in reg


def test_member_without_name_is_refused():
    with pytest.raises(ValueError, match="has no 'name'"):
        Registry("widget").register(object())
