from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory

from portal.requests import signed_in_user

pytestmark = pytest.mark.django_db


def test_the_signed_in_user_is_the_request_user_and_nobody_is_refused(world: Any) -> None:
    request = RequestFactory().get("/")
    request.user = world.users["researcher"]
    assert signed_in_user(request) is world.users["researcher"]
    request.user = AnonymousUser()
    with pytest.raises(PermissionDenied):
        signed_in_user(request)
