"""Streaming detokenization: deltas never split a character, never show a stop string,
and always add up to the final text."""
from __future__ import annotations

from kvmap.model.byte_tokenizer import ByteTokenizer
from kvmap.server.detokenize import IncrementalDetokenizer


def stream(ids: list[int], stop=(), final: str | None = None) -> list[str]:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, tuple(stop))
    # as the engine loop does: every step but the finishing one goes through update()
    deltas = [detok.update(ids[:n]) for n in range(1, len(ids))]
    deltas.append(detok.finish(tok.decode(ids) if final is None else final))
    return deltas


def test_multibyte_characters_are_held_until_complete():
    text = "aé€😀b"
    ids = list(text.encode())
    deltas = stream(ids)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    # "€" is 3 bytes: nothing is sent while only 1 or 2 of them arrived
    euro = text.encode().index("€".encode())
    assert deltas[euro] == "" and deltas[euro + 1] == "" and deltas[euro + 2] == "€"
    assert deltas[-1] == "b"


def test_stop_string_is_never_sent():
    text = "hello STOP world"
    ids = list(text.encode())
    stop_at = text.index("STOP")
    # the engine finishes when "STOP" completes and cuts the text before it
    done = stop_at + len("STOP")
    deltas = stream(ids[:done], stop=("STOP", "x"), final=text[:stop_at])
    assert "".join(deltas) == "hello "
    # before the finish, the last len("STOP") - 1 = 3 characters were always held back
    assert "".join(deltas[:-1]) == text[:done - 1 - 3]


def test_invalid_bytes_are_sent_once_followed_by_valid_text():
    ids = [0xFF, ord("a"), ord("b")]
    deltas = stream(ids)
    assert deltas[0] == ""                  # "\ufffd" alone might still be a prefix
    assert "".join(deltas) == "\ufffdab"


def test_no_tokenizer_gives_no_text():
    detok = IncrementalDetokenizer(None)
    assert detok.update([1, 2, 3]) == ""
