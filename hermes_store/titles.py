"""Session title rules (pure functions, no database access).

Titles are shown in terminals and chat UIs and are looked up by exact text, so invisible
characters (zero-width spaces, bidi overrides, BOMs) must not create look-alike titles
that differ only in what cannot be seen; the same cleaning Hermes applies is done here.
"""

from __future__ import annotations

import re

from .codec import clean_text
from .errors import InvalidTitleError

__all__ = [
    "AUTO_TITLE_SOURCES", "MAX_TITLE_LENGTH", "TITLE_SOURCES", "TITLE_SOURCE_DERIVED", "TITLE_SOURCE_LLM",
    "TITLE_SOURCE_USER", "automatic_title_lands", "sanitize_title", "split_title_number",
]

#: Longest title accepted, counted in characters after cleaning.
MAX_TITLE_LENGTH = 100

#: Who set a title (Hermes v25 ``title_source``): derived from the first message, generated
#: by a model, or typed by a person.
TITLE_SOURCE_DERIVED = "derived"
TITLE_SOURCE_LLM = "llm"
TITLE_SOURCE_USER = "user"
#: Lowest rank first: an automatic title replaces only a title of a strictly lower rank.
TITLE_SOURCES = (TITLE_SOURCE_DERIVED, TITLE_SOURCE_LLM, TITLE_SOURCE_USER)
#: The sources an automatic title may claim.
AUTO_TITLE_SOURCES = (TITLE_SOURCE_DERIVED, TITLE_SOURCE_LLM)

# Tab, newline and carriage return are layout, not garbage: they become spaces so
# "a\tb" stays two words. Every other ASCII control character is dropped.
_LAYOUT_RE = re.compile(r"[\t\n\r]")
_INVISIBLE_RE = re.compile(
    "["
    "\x00-\x08\x0b\x0c\x0e-\x1f\x7f"  # ASCII control characters
    "\u200b-\u200f"  # zero-width space/joiners, LRM/RLM
    "\u2028-\u202e"  # line/paragraph separators, bidi embeddings and overrides
    "\u2060-\u2069"  # word joiner, invisible operators, bidi isolates
    "\ufeff"  # BOM / zero-width no-break space
    "\ufff9-\ufffc"  # interlinear annotations, object replacement character
    "]"
)
_SPACES_RE = re.compile(r"\s+")
_NUMBERED_RE = re.compile(r"^(?P<base>.+) #(?P<n>[1-9][0-9]*)$", re.DOTALL)


def sanitize_title(title: str | None) -> str | None:
    """Clean a user-supplied title; None for an empty result.

    Lone surrogates are scrubbed first (Hermes v23 does the same before its v11 rules):
    a surrogate pair written as two code points becomes its character, a lone half
    U+FFFD. Raises InvalidTitleError (a ValueError) when the cleaned title is longer
    than MAX_TITLE_LENGTH (we refuse rather than silently truncate, so two long titles
    never collide on their common prefix) or when the value is not a string.
    """
    if title is None:
        return None
    if not isinstance(title, str):
        raise InvalidTitleError(f"title must be a string, not {type(title).__name__}")
    cleaned = _LAYOUT_RE.sub(" ", clean_text(title))
    cleaned = _INVISIBLE_RE.sub("", cleaned)
    cleaned = _SPACES_RE.sub(" ", cleaned).strip()
    if not cleaned:
        return None
    if len(cleaned) > MAX_TITLE_LENGTH:
        # Hermes' own wording: callers show it to users and some match on it.
        raise InvalidTitleError(f"Title too long ({len(cleaned)} chars, max {MAX_TITLE_LENGTH})")
    return cleaned


def split_title_number(title: str) -> tuple[str, int | None]:
    """Split a lineage title "base #N" into ("base", N); ("title", None) otherwise.

    Only a positive number written without leading zeros counts ("x #0", "x #007",
    "x #abc" are plain titles), so formatting the pair back gives the same text.
    """
    m = _NUMBERED_RE.match(title)
    if m is None:
        return title, None
    return m.group("base"), int(m.group("n"))


def automatic_title_lands(current_title: str | None, current_source: str | None, source: str) -> bool:
    """Whether an automatic title from ``source`` may replace what the row holds (v25).

    An untitled row takes it; a titled one only when its source ranks strictly lower.
    A title of NULL or unknown source (written before v25, or by a newer Hermes) ranks
    as a person's, so no automatic title ever replaces it.
    """
    if current_title is None:
        return True
    held = TITLE_SOURCES.index(current_source) if current_source in TITLE_SOURCES else len(TITLE_SOURCES) - 1
    return held < TITLE_SOURCES.index(source)
