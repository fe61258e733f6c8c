"""Ranked search over the catalog, one rule for the CLI and the site: deterministic scores, so the same query
always gives the same order.

Scores, from strongest to weakest evidence: the whole query is the name (1000), the name contains the whole
query (500); then for each word of the query: a tag equal to it (100), the name contains it (50), the
description, notes, author or dtypes contain it as a word (10). An entry matches when every word scores
somewhere. Ties are broken by name.

The rule reads an entry only through :func:`ranking_record` (its name, tags and words). ``tritonkit index render``
embeds those records and :data:`WEIGHTS` in the site, whose ``app.js`` scores them with the same arithmetic as
:func:`score_record`, so the page's order is the CLI's (a browser test holds them to it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from tritonkit.index.schema import Entry

EXACT_NAME, NAME_CONTAINS_QUERY, TAG, NAME_CONTAINS_WORD, TEXT_WORD = 1000, 500, 100, 50, 10
WEIGHTS = {"exact_name": EXACT_NAME, "name_contains_query": NAME_CONTAINS_QUERY, "tag": TAG,
           "name_contains_word": NAME_CONTAINS_WORD, "text_word": TEXT_WORD}  # fmt: skip
_WORD = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")


def _words(text: str) -> set[str]:
    """Lowercase words, keeping joined forms ('flash-decoding') and their parts ('flash', 'decoding')."""
    words = set()
    for word in _WORD.findall(text.lower()):
        words.add(word)
        words.update(re.split(r"[._-]", word))
    return words


def ranking_record(entry: Entry) -> dict:
    """What the rule reads of an entry: its name, its tags and the words of its text, all lowercase."""
    text = " ".join((entry.description, entry.notes, entry.author, " ".join(entry.dtypes)))
    return {
        "name": entry.name.lower(),
        "tags": sorted({tag.lower() for tag in entry.tags}),
        "words": sorted(_words(text)),
    }


def query_words(query: str) -> list[str]:
    """The words of a query: lowercase, split on whitespace (app.js splits the same way)."""
    return query.strip().lower().split()


def score_record(record: Mapping, query: str) -> int:
    """How well a :func:`ranking_record` matches ``query``; 0 when some word of the query matches nothing."""
    query = query.strip().lower()
    name = record["name"]
    total = 0
    if query == name:
        total += EXACT_NAME
    elif query and query in name:
        total += NAME_CONTAINS_QUERY
    tags, text = set(record["tags"]), set(record["words"])
    for word in query_words(query):
        word_score = 0
        if word in tags:
            word_score += TAG
        if word in name:
            word_score += NAME_CONTAINS_WORD
        if word in text:
            word_score += TEXT_WORD
        if word_score == 0:
            return 0
        total += word_score
    return total


def score(entry: Entry, query: str) -> int:
    """How well ``entry`` matches ``query`` (:func:`score_record` of its record)."""
    return score_record(ranking_record(entry), query)


def search(entries: Iterable[Entry], query: str, tag: str | None = None) -> list[tuple[int, Entry]]:
    """(score, entry) of the matching entries, best first; only entries tagged ``tag`` when given."""
    pool = [e for e in entries if tag is None or tag in e.tags]
    if not query_words(query):
        return [(0, e) for e in sorted(pool, key=lambda e: e.name)]
    scored = [(score(e, query), e) for e in pool]
    return sorted(((s, e) for s, e in scored if s > 0), key=lambda pair: (-pair[0], pair[1].name))
