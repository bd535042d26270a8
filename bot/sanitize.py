"""Input hygiene: every inbound event's text, made safe before anything stores it.

The runtime calls `sanitize_event` once per event, before the event is
recorded or rendered (bot/runtime.py), so no adapter has to remember to.
What it does, and why:

- Lone surrogates ("\\ud800", or bytes an adapter decoded with
  `surrogateescape`) become U+FFFD, the same as decoding with
  errors="replace": sqlite3 and UTF-8 JSON encoding raise on them. A high and
  low surrogate in the right order are joined into the character they encode.
- C0 and C1 control characters go, except tab and newline (CR and CRLF become
  newline): they carry nothing a person meant, and some break terminals, logs
  and tokenizers.
- Invisible format characters (zero-width space and joiners, word joiner,
  BOM, variation selectors, bidi embeddings, overrides and isolates...) are
  kept, since emoji sequences and right-to-left text need them, but a run of
  more than MAX_INVISIBLE_RUN in a row (no legitimate text has one) collapses
  to its first character. Unicode tag characters, invisible ASCII look-alikes
  used to smuggle hidden instructions to a model, go unless they spell a flag
  (🏴 + tags + cancel tag).
- Names (display names, channels, filenames, places) become one line, whitespace
  runs collapsed, at most MAX_NAME_CHARS: a name is no place for a newline
  that starts a fake system line in the prompt.

Message text is never shortened here: it is stored whole in recall storage,
and the queue manager shows an over-long message shortened to the model with
a note (MEMGPT_MAX_MESSAGE_TOKENS, memory/queue_manager.py).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from bot.events import Event

MAX_INVISIBLE_RUN = 3
MAX_NAME_CHARS = 200

# Event fields that are names (one line, capped) and ids (left as they are,
# but for surrogates: changing an id would split or merge users).
NAME_FIELDS = frozenset({"display_name", "channel", "place", "filename", "content_type"})
ID_FIELDS = frozenset({"platform", "user_id", "event_id"})

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 except tab and newline, DEL, C1. CR is turned into a newline first.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_INVISIBLE_CLASS = (
    "\u00ad"  # soft hyphen
    "\u034f"  # combining grapheme joiner
    "\u061c"  # Arabic letter mark
    "\u115f\u1160\u3164\uffa0"  # Hangul fillers (render as nothing)
    "\u180b-\u180f"  # Mongolian variation selectors and vowel separator
    "\u200b-\u200f"  # zero-width space, non-joiner, joiner; LRM, RLM
    "\u202a-\u202e"  # bidi embeddings and overrides
    "\u2060-\u2064"  # word joiner, invisible operators
    "\u2066-\u2069"  # bidi isolates
    "\u206a-\u206f"  # deprecated format characters
    "\ufe00-\ufe0f"  # variation selectors
    "\ufeff"  # BOM / zero-width no-break space
    "\ufff9-\ufffb"  # interlinear annotation
    "\U0001d173-\U0001d17a"  # musical format characters
    "\U000e0100-\U000e01ef"  # variation selectors supplement
)
_INVISIBLE_RUN = re.compile(f"([{_INVISIBLE_CLASS}])[{_INVISIBLE_CLASS}]{{{MAX_INVISIBLE_RUN},}}")
_FLAG_TAGS = "\U0001f3f4[\U000e0030-\U000e0039\U000e0061-\U000e007a]{1,6}\U000e007f"
_TAGS = re.compile(f"({_FLAG_TAGS})|[\U000e0000-\U000e007f]")
_WHITESPACE = re.compile(r"\s+")


def fix_surrogates(text: str) -> str:
    """Lone surrogates become U+FFFD; a well-ordered pair becomes its character."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def fix_surrogates_in(value: Any) -> Any:
    """`fix_surrogates` on every string of a JSON-like value (dicts, lists):
    JSON may spell a lone surrogate ("\\ud800"), which no UTF-8 store can hold."""
    if isinstance(value, str):
        return fix_surrogates(value)
    if isinstance(value, dict):
        return {fix_surrogates_in(key): fix_surrogates_in(item) for key, item in value.items()}
    if isinstance(value, list):
        return [fix_surrogates_in(item) for item in value]
    return value


def clean_text(text: str) -> str:
    """A message body, safe to store, index, encode and show to the model."""
    text = fix_surrogates(text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    if text.isascii():  # nothing invisible can be left
        return text
    text = _TAGS.sub(lambda match: match.group(1) or "", text)
    return _INVISIBLE_RUN.sub(r"\1", text)


def clean_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name: clean, on one line, at most `limit` characters."""
    text = _WHITESPACE.sub(" ", clean_text(text)).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def sanitize_event(event: Event) -> Event:
    """Clean every text field of `event` in place (and return it)."""
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        if not isinstance(value, str) or not value:
            continue
        if item.name in ID_FIELDS:
            cleaned = fix_surrogates(value)
        elif item.name in NAME_FIELDS:
            cleaned = clean_name(value)
        else:
            cleaned = clean_text(value)
        if cleaned is not value:
            setattr(event, item.name, cleaned)
    return event
