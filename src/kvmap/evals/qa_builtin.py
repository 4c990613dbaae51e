"""The built-in QA set of task ``qa``: questions about facts placed in built-in corpus text.

Each question's context is about ``context_tokens`` tokens of corpus text (a piece from its
own start paragraph, ``TextSource``) with ``FACTS_PER_CONTEXT`` templated facts placed at
uniformly random sentence boundaries. The facts are of distinct relations, about invented
people and places, each in a plain "X is Y." form; the first one is asked:

    ... corpus text ... The mayor of Velmora is Aiko Novak. ... corpus text ...
    The favourite colour of Omar Sato is crimson. ... The dog of Hana Petrov is called
    Mochi. ... corpus text ...

    question       Who is the mayor of Velmora?
    answer_prefix  The mayor of Velmora is            (starts the assistant's answer)
    answers        ["Aiko Novak"]                       (a span of the context)

Everything is drawn by code from ``seed``: the texts, the relations, the keys and values,
the depths. No item is selected by what any model answers: the design (relations whose
values are names or colours, distinct relations per context, the answer started as a
sentence) was chosen on SmolLM2-135M's bf16 full cache, and its exact match there is
measured unfiltered over the whole set (``docs/qa.md``). Relations with common-word values
("the password of the X office is velvet") and a second fact of the asked relation in the
same context were tried and dropped: the baseline fell below 0.6 exact match with them.

Items are records in the JSONL form ``qa.parse_qa`` reads, plus ``context_tokens`` and
``relation`` (kept for the per-sample records).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvmap.evals.retrieval import insert_sentences
from kvmap.workloads.corpus import TextSource

DEFAULT_CONTEXT_TOKENS = (384, 768, 1152, 1536)
DEFAULT_NUM_QUESTIONS = 48
FACTS_PER_CONTEXT = 3

FIRST_NAMES = ("Maria", "Tomas", "Aiko", "Kwame", "Ingrid", "Rafael", "Leila", "Dmitri",
               "Sofia", "Omar", "Hana", "Lucas")
LAST_NAMES = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Petrov", "Alvarez", "Haddad",
              "Novak", "Brennan", "Castillo", "Mensah", "Sato")
PLACES = ("Tarnby", "Velmora", "Quillhaven", "Dunmarsh", "Korvel", "Ashgrove", "Brindle",
          "Oskaria", "Fenwick", "Marlow", "Zerath", "Elmsby")
COLOURS = ("green", "purple", "orange", "silver", "yellow", "crimson")
DOG_NAMES = ("Biscuit", "Pepper", "Rufus", "Mochi", "Ziggy", "Bruno", "Luna", "Waffles")


@dataclass(frozen=True)
class Relation:
    """A fact template: ``{k}`` is the key, ``{v}`` the value; kinds name their pools."""

    name: str
    fact: str
    question: str
    answer_prefix: str
    key_kind: str
    value_kind: str


RELATIONS = (
    Relation("mayor", "The mayor of {k} is {v}.", "Who is the mayor of {k}?",
             "The mayor of {k} is", "place", "person"),
    Relation("librarian", "The librarian of {k} is {v}.", "Who is the librarian of {k}?",
             "The librarian of {k} is", "place", "person"),
    Relation("colour", "The favourite colour of {k} is {v}.",
             "What is the favourite colour of {k}?", "The favourite colour of {k} is",
             "person", "colour"),
    Relation("hometown", "The hometown of {k} is {v}.", "What is the hometown of {k}?",
             "The hometown of {k} is", "person", "place"),
    Relation("dog", "The dog of {k} is called {v}.", "What is the dog of {k} called?",
             "The dog of {k} is called", "person", "dog"),
)


def _draw(rng: np.random.Generator, kind: str) -> str:
    if kind == "person":
        return f"{FIRST_NAMES[rng.integers(len(FIRST_NAMES))]} " \
               f"{LAST_NAMES[rng.integers(len(LAST_NAMES))]}"
    pool = {"place": PLACES, "colour": COLOURS, "dog": DOG_NAMES}[kind]
    return pool[rng.integers(len(pool))]


def builtin_records(tokenizer, *, context_tokens: tuple[int, ...] = DEFAULT_CONTEXT_TOKENS,
                    num_questions: int = DEFAULT_NUM_QUESTIONS, seed: int = 0,
                    text: str | None = None) -> list[dict]:
    """``num_questions`` QA records, question i at ``context_tokens[i % len]`` tokens of
    context (about: the facts replace a few corpus tokens). ``text`` replaces the
    built-in corpus. Pure in its arguments. ValueError when a context length leaves no
    room for corpus text beside the facts."""
    source = TextSource(tokenizer, np.random.default_rng(seed), text)
    records = []
    for i in range(num_questions):
        num_tokens = context_tokens[i % len(context_tokens)]
        rng = np.random.default_rng([seed, i])
        relations = [RELATIONS[j] for j in rng.permutation(len(RELATIONS))[:FACTS_PER_CONTEXT]]
        facts = [(r, _draw(rng, r.key_kind), _draw(rng, r.value_kind)) for r in relations]
        sentences = [(float(rng.uniform()), r.fact.format(k=k, v=v)) for r, k, v in facts]
        overhead = sum(source.num_tokens(s) for _, s in sentences)
        if num_tokens < overhead + 32:
            raise ValueError(f"context={num_tokens} tokens leaves no room for corpus text "
                             f"beside ~{overhead} tokens of facts; give at least "
                             f"{overhead + 32}")
        context = insert_sentences(source.take(num_tokens - overhead), sentences)
        asked, key, value = facts[0]
        records.append({"context": context, "question": asked.question.format(k=key),
                        "answers": [value], "answer_prefix": asked.answer_prefix.format(k=key),
                        "context_tokens": num_tokens, "relation": asked.name})
    return records
