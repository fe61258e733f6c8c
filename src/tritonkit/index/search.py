"""Ranked search over the catalog: deterministic scores, so the same query always gives the same order.

Scores, from strongest to weakest evidence: the whole query is the name (1000), the name contains the whole
query (500); then for each word of the query: a tag equal to it (100), the name contains it (50), the
description, notes, author or dtypes contain it as a word (10). An entry matches when every word scores
somewhere. Ties are broken by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tritonkit.index.schema import Entry

EXACT_NAME, NAME_CONTAINS_QUERY, TAG, NAME_CONTAINS_WORD, TEXT_WORD = 1000, 500, 100, 50, 10
_WORD = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")


def _words(text: str) -> set[str]:
    """Lowercase words, keeping joined forms ('flash-decoding') and their parts ('flash', 'decoding')."""
    words = set()
    for word in _WORD.findall(text.lower()):
        words.add(word)
        words.update(re.split(r"[._-]", word))
    return words


def score(entry: Entry, query: str) -> int:
    """How well ``entry`` matches ``query``; 0 when some word of the query matches nothing."""
    query = query.strip().lower()
    name = entry.name.lower()
    total = 0
    if query == name:
        total += EXACT_NAME
    elif query and query in name:
        total += NAME_CONTAINS_QUERY
    text = _words(" ".join((entry.description, entry.notes, entry.author, " ".join(entry.dtypes))))
    tags = {tag.lower() for tag in entry.tags}
    for word in query.split():
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


def search(entries: Iterable[Entry], query: str, tag: str | None = None) -> list[tuple[int, Entry]]:
    """(score, entry) of the matching entries, best first; only entries tagged ``tag`` when given."""
    pool = [e for e in entries if tag is None or tag in e.tags]
    if not query.strip():
        return [(0, e) for e in sorted(pool, key=lambda e: e.name)]
    scored = [(score(e, query), e) for e in pool]
    return sorted(((s, e) for s, e in scored if s > 0), key=lambda pair: (-pair[0], pair[1].name))
