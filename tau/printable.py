"""The one rule for names people and workloads choose and others read: printable text.

A metric name, an artifact's name, an experiment's labels, a workspace's or an API token's
name is shown as text on pages, in the CLI and in logs. Some characters would hide,
reorder or break it there: a right-to-left override (U+202E) before ``gnp.exe`` makes it
read as ``exe.png``, zero-width characters make two names that look the same differ, control
characters and line separators break lines and terminals, and lone surrogates cannot even be
stored. Every place that accepts such a name asks :func:`hidden_character_problem`.

Letters of every script, accents, emoji and spaces are all fine: the rule is about what a
reader cannot see, not about what is not ASCII.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories a name may not contain: control characters (Cc), invisible format
#: characters such as the bidi overrides, isolates and marks and the zero-width joiners
#: (Cf), lone surrogates (Cs) and the line and paragraph separators (Zl, Zp).
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def hidden_character(text: str) -> str | None:
    """The first character of ``text`` a reader would not see as itself, or None."""
    if text.isprintable():
        # Python's unprintable characters are the categories Other and Separator but the
        # space: every hidden one among them. One pass in C instead of a lookup a character
        # (a manifest checks a million paths).
        return None
    for character in text:
        if unicodedata.category(character) in HIDDEN_CATEGORIES:
            return character
    return None


def hidden_character_problem(text: str, what: str) -> str | None:
    """Why ``text`` cannot be ``what`` ("metric names", "an artifact's name"), or None:
    ``"<what> must be printable text; U+202E (RIGHT-TO-LEFT OVERRIDE) is an invisible or
    control character"``."""
    character = hidden_character(text)
    if character is None:
        return None
    name = unicodedata.name(character, "")
    named = f" ({name})" if name else ""
    return (
        f"{what} must be printable text; U+{ord(character):04X}{named} is an invisible or "
        "control character"
    )
