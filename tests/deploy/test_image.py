"""The portal's image, built from deploy/Containerfile with buildah by ``make test`` before its
tests (deploy/dev/oci_image.py; the base is a stand-in for python:3.11-slim made from Debian's
packages, since no container registry is reachable here), looked into:

* it runs as the unprivileged user 10001, in /opt/taugrid/app, gunicorn by default;
* no compiler, no pip, no setuptools in it; the static files collected, with their manifest;
* the portal inside it passes ``manage.py check --deploy`` with the settings the Helm chart
  gives it (production values), and its processes start: gunicorn parses its command, celery
  and the watcher's command are there;
* the user can write nothing of the image but /tmp and the state directory (the code, the
  environment and the static files are root's), so the portal's checks passing as that user
  show that a read-only root filesystem (as the chart mounts it) is enough.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.deploy.helm import PRODUCTION_VALUES, Helm, helm_binary, pod_specs
from tests.portal.test_settings import PRODUCTION_SECRETS
from tests.scripts import load_script

from .helm import REPO

pytestmark = pytest.mark.services

image_tool = load_script(REPO / "deploy" / "dev" / "oci_image.py", "taugrid_oci_image")

SECRETS = {
    **PRODUCTION_SECRETS,
    "TAU_OIDC_CLIENT_SECRET": "client-secret-for-the-image-check",
    "TAU_METRICS_TOKEN": "metrics-token-for-the-image-check-0123456789",
    "TAU_EMAIL_PASSWORD": "smtp-password-for-the-image-check",
}


@pytest.fixture(scope="module")
def image() -> str:
    """The image ``make test`` built before its tests, from this checkout (a failure, never a
    build or a skip, when it is missing or older than the code)."""
    try:
        name: str = image_tool.built()
    except image_tool.ImageError as error:
        pytest.fail(str(error))
    return name


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """One container of the image for all the checks (nothing they run writes to it)."""
    made: str = image_tool.new_container(image)
    yield made
    image_tool.remove_container(made)


#: buildah's chroot isolation copies a command's output through pipes of its own, and on a
#: loaded machine it once returned exit 0 with none of it (a probe's JSON missing, while
#: ``make test``'s two lanes ran). The checks run only read-only probes: one that printed
#: nothing is run again, a few times at most.
TRIES_FOR_OUTPUT = 3


@pytest.fixture
def inside(container: str) -> Callable[..., Any]:
    def run(*command: str, env: dict[str, str] | None = None) -> Any:
        for _ in range(TRIES_FOR_OUTPUT):
            done = image_tool.run_inside(container, list(command), env=env)
            if done.returncode != 0 or done.stdout.strip():
                break
        return done

    return run


def test_the_image_runs_unprivileged_with_gunicorn_by_default(
    image: str, inside: Callable[..., Any]
) -> None:
    config = image_tool.inspect(image)["OCIv1"]["config"]
    assert config["User"] == "10001:10001"
    assert config["WorkingDir"] == "/opt/taugrid/app"
    assert config["Cmd"][:2] == ["gunicorn", "portal.wsgi:application"]
    assert "8000/tcp" in config["ExposedPorts"]
    who = inside("id", "-u")
    assert who.stdout.strip() == "10001", who.stderr
    writable = inside(
        "python",
        "-c",
        "import os; print(sorted(p for p in ('/opt/taugrid/app', '/opt/taugrid/venv', "
        "'/opt/taugrid/static', '/usr', '/etc', '/tmp', '/var/lib/taugrid') "
        "if os.access(p, os.W_OK)))",
    )
    assert writable.stdout.strip() == "['/tmp', '/var/lib/taugrid']", writable.stderr


def test_nothing_to_build_or_install_with_is_in_the_image(inside: Callable[..., Any]) -> None:
    probe = (
        "import importlib.util, json, shutil; "
        "print(json.dumps({"
        "'tools': [t for t in ('gcc', 'cc', 'g++', 'make', 'pip', 'pip3') if shutil.which(t)], "
        "'modules': [m for m in ('pip', 'setuptools') if importlib.util.find_spec(m)]}))"
    )
    done = inside("python", "-c", probe)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {"tools": [], "modules": []}, found
    static = inside(
        "python",
        "-c",
        "import json; print(len(json.load(open('/opt/taugrid/static/staticfiles.json'))['paths']))",
    )
    assert static.returncode == 0, static.stderr
    assert int(static.stdout) > 100  # every static file, hashed


def chart_env() -> dict[str, str]:
    """The web container's environment from the chart (production values), the secrets given
    as values instead of the files the chart mounts (the Secrets are not there)."""
    objects = Helm(helm_binary()).objects(PRODUCTION_VALUES)
    _, spec = next(item for item in pod_specs(objects) if item[0] == "Deployment/taugrid-web")
    env = {item["name"]: item["value"] for item in spec["containers"][0]["env"]}
    for name in list(env):
        if name.endswith("_FILE"):
            del env[name]
    env.pop("TAU_EVIDENCE_PUBLIC_KEYS_FILE", None)
    return {**env, **SECRETS}


def test_the_portal_in_the_image_passes_the_deploy_check_with_the_charts_settings(
    inside: Callable[..., Any],
) -> None:
    done = inside(
        "python", "manage.py", "check", "--deploy", "--fail-level", "WARNING", env=chart_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_the_workloads_commands_start_in_the_image(inside: Callable[..., Any]) -> None:
    env = chart_env()
    gunicorn = inside(
        "python",
        "-c",
        "from gunicorn.config import Config; c = Config(); "
        "import sys; a = c.parser().parse_args(['--bind=0.0.0.0:8000', '--forwarded-allow-ips=', "
        "'--no-control-socket', '--worker-tmp-dir=/tmp']); "
        "import portal.wsgi; print('wsgi ok')",
        env=env,
    )
    assert gunicorn.returncode == 0, gunicorn.stderr
    assert gunicorn.stdout.strip() == "wsgi ok"
    for command in (
        ["celery", "--app=portal", "worker", "--help"],
        ["celery", "--app=portal", "beat", "--help"],
        ["python", "manage.py", "run_kube_watcher", "--help"],
        ["python", "manage.py", "migrate", "--help"],
    ):
        done = inside(*command, env=env)
        assert done.returncode == 0, (command, done.stderr[-2000:])
