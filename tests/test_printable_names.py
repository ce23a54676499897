"""One rule for every name people and workloads choose and others read (``tau.printable``):
printable text, so that no name reads as something it is not (issue 30: artifact names took
right-to-left overrides). Metric and artifact names have their own tests
(tests/runs/test_report_limits.py, tests/artifacts/test_artifacts.py); here the others:
a tau.yaml's experiment labels and paths, a workspace's name, an API token's name."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from identity.models import ApiToken
from tau.printable import hidden_character, hidden_character_problem
from tau.spec import validate

pytestmark = pytest.mark.django_db

RLO = "\u202e"  # right-to-left override

HIDDEN = ["\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\x07", "\u2028", "\u2029"]
SHOWN = ["Gewichte (ü)", "权重", "📦 model", "a b", "مرحبا", "x-y_z.1"]


@pytest.mark.parametrize("character", HIDDEN)
def test_the_rule_refuses_what_a_reader_cannot_see(character: str) -> None:
    assert hidden_character(f"a{character}b") == character
    problem = hidden_character_problem(f"a{character}b", "A name")
    assert problem is not None
    assert problem.startswith(f"A name must be printable text; U+{ord(character):04X}")


@pytest.mark.parametrize("text", SHOWN)
def test_every_script_and_emoji_is_fine(text: str) -> None:
    assert hidden_character(text) is None


def test_a_specs_labels_and_paths_follow_it() -> None:
    problems = validate(
        "schema_version: 1\nname: demo\nrun:\n"
        f"  entrypoint: tr{RLO}ain.py\n"
        "experiment:\n"
        f"  project: vi{RLO}sion\n"
        "outputs:\n"
        f"  artifacts: [model/{RLO}*]\n"
    )
    said = {problem.path: problem.message for problem in problems}
    assert set(said) == {"run.entrypoint", "experiment.project", "outputs.artifacts[0]"}
    assert all("U+202E (RIGHT-TO-LEFT OVERRIDE) is an invisible" in m for m in said.values())


def test_a_workspaces_name_follows_it(world: Any) -> None:
    client = world.api_client_for("workspace_admin")
    response = client.patch("/api/v1/workspaces/alpha/", {"name": f"Alpha{RLO}"}, format="json")
    assert response.status_code == 400
    assert response.json()["name"] == [
        "A workspace's name must be printable text; U+202E (RIGHT-TO-LEFT OVERRIDE) is an "
        "invisible or control character."
    ]
    world.alpha.refresh_from_db()
    assert world.alpha.name == "Alpha"


def test_a_tokens_name_follows_it(world: Any) -> None:
    page = world.client_for("researcher").post(
        reverse("tokens"), {"name": f"laptop{RLO}", "expires_in_days": "30"}
    )
    assert page.status_code == 400
    assert "A token&#x27;s name must be printable text; U+202E" in page.content.decode()
    assert not ApiToken.objects.filter(user=world.users["researcher"]).exists()
