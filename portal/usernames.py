"""What a username may be: ASCII letters, digits and ``. @ + - _``, at most 150 characters.

Usernames are identifiers: people type them into the CLI and the API (``/members/<name>/``),
read them in member lists and the audit log, and decide whom to trust by them. Django allows
any Unicode letter, so ``researcher`` spelt with a Cyrillic U+0435 for its ``e`` would be a
second account that reads exactly like ``researcher``. Keeping usernames to ASCII removes
every cross-script look-alike at once, without a confusables table to keep up to date;
names in any script still belong in the first and last name, shown next to the username.

Where a username comes from decides what happens to one outside the rule:

- typed by a person (``createsuperuser``, the admin, a model form, ``full_clean``): refused,
  with a message, by :func:`validate_username` on the user model's username field;
- an identity provider's claim (:func:`from_claim`): accents are dropped (``José`` becomes
  ``Jose``) and whatever is still outside the rule makes the portal choose a neutral name
  instead (``user-3f9a…``), so a login never fails over it and never lands on a look-alike;
- a member lookup: refused with the same answer as an unknown name (workspaces/services.py).

Compatibility forms are folded first (NFKC, as Django does when it saves a user), so a
``rob`` in fullwidth letters (U+FF52 …) is ``rob``.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

_ALLOWED = re.compile(r"[A-Za-z0-9.@+_-]{1,150}")
RULE = "Use at most 150 ASCII letters, digits and . @ + - _ (no letters from other scripts)."


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def is_allowed(username: str) -> bool:
    """Whether ``username`` (as given, before normalising) is a username the portal accepts."""
    return _ALLOWED.fullmatch(normalise(username)) is not None


def validate_username(value: str) -> None:
    if not isinstance(value, str) or not is_allowed(value):
        raise ValidationError(f"Not a valid username. {RULE}", code="invalid_username")


def from_claim(claim: str, *, issuer: str, subject: str) -> str:
    """A username for a new single sign-on user, from the provider's username claim."""
    folded = "".join(
        char
        for char in unicodedata.normalize("NFKD", normalise(claim))
        if not unicodedata.combining(char)
    )
    if _ALLOWED.fullmatch(folded):
        return folded
    # Not a username we accept, even without accents: a neutral one, the same at each try.
    digest = hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()[:12]
    return f"user-{digest}"


def install() -> None:
    """Add :func:`validate_username` to the user model's username field, so the admin's
    forms, ``createsuperuser`` and ``full_clean`` all apply it.

    Only the field's runtime list of validators changes, not its definition (``_validators``,
    which migrations read), so no migration for django.contrib.auth follows from it.
    """
    user_model = get_user_model()
    field = user_model._meta.get_field(user_model.USERNAME_FIELD)
    validators = list(field.validators)  # type: ignore[union-attr]
    if validate_username not in validators:
        field.__dict__["validators"] = [*validators, validate_username]
