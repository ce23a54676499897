"""Usernames are ASCII: a look-alike of someone else's name (a Cyrillic e in "researcher")
cannot be created by createsuperuser, the admin or a model form. (Single sign-on is in
test_oidc_login.py, member lookups in tests/workspaces/test_member_lookup.py.)"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.urls import reverse

from portal import usernames

pytestmark = pytest.mark.django_db

LOOK_ALIKE = "r\u0435searcher"  # the second letter is Cyrillic


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("researcher", True),
        ("ada.lovelace@example.org", True),
        ("a+b_c-d", True),
        ("\uff52\uff4f\uff42", True),  # fullwidth "rob": stored as "rob"
        (LOOK_ALIKE, False),
        ("\u0440\u043e\u0431", False),
        ("Jos\u00e9", False),
        ("rob\u200b", False),  # a zero-width space
        ("ada lovelace", False),
        ("", False),
        ("a" * 151, False),
    ],
)
def test_the_username_rule(name: str, allowed: bool) -> None:
    assert usernames.is_allowed(name) is allowed


def test_createsuperuser_refuses_a_look_alike(django_user_model: Any) -> None:
    with pytest.raises(CommandError, match="ASCII"):
        call_command(
            "createsuperuser",
            interactive=False,
            username=LOOK_ALIKE,
            email="x@example.org",
            stdout=io.StringIO(),
        )
    assert not django_user_model.objects.filter(username=LOOK_ALIKE).exists()
    call_command(
        "createsuperuser",
        interactive=False,
        username="researcher",
        email="x@example.org",
        stdout=io.StringIO(),
    )
    assert django_user_model.objects.filter(username="researcher", is_superuser=True).exists()


def test_the_admin_refuses_a_look_alike(world: Any, django_user_model: Any) -> None:
    client = world.client_for("platform_admin")
    url = reverse("admin:auth_user_add")
    form = {"usable_password": "false", "password1": "", "password2": ""}
    refused = client.post(url, {**form, "username": LOOK_ALIKE})
    assert refused.status_code == 200  # the form again, with the error
    assert "ASCII letters" in refused.content.decode()
    assert not django_user_model.objects.filter(username=LOOK_ALIKE).exists()
    created = client.post(url, {**form, "username": "researcher"})
    assert created.status_code == 302
    assert django_user_model.objects.filter(username="researcher").exists()


def test_full_clean_refuses_a_look_alike(django_user_model: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        django_user_model(username=LOOK_ALIKE).full_clean()
    assert any("ASCII" in message for message in refused.value.message_dict["username"])
    django_user_model(username="researcher", password="!").full_clean()  # the rule, not more
