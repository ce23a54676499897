"""Settings from the environment: the embedded default needs nothing, production needs
everything that matters and passes Django's deployment checklist.

Settings are read once per process, so most of these tests start Python with exactly the
environment they check: they are slow tests (tests/tiers.py), run by make test and not by
make test-fast."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from portal.env import ImproperlyConfiguredEnv, parse_database_url

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_ENV = {
    "TAU_ENV": "production",
    "TAU_SECRET_KEY": "x" * 20 + "-production-secret-for-the-deploy-check-only-" + "y" * 10,
    "DATABASE_URL": "postgres://taugrid:secret@db.internal:5432/taugrid",
    "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
    "TAU_ALLOWED_HOSTS": "taugrid.example.org",
    "TAU_TOKEN_PEPPERS": "1:a-pepper-for-the-deploy-check-only",
    "TAU_EVIDENCE_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VwBCIEIFSl0sUQ7Sa7YRpqm8Ql6wcL7t6mFqSkM8i1b1hcg3Hj\n"
    "-----END PRIVATE KEY-----",
}
#: The secrets of PRODUCTION_ENV: what an installation keeps in Secrets (the Helm chart's).
PRODUCTION_SECRETS = {
    name: PRODUCTION_ENV[name]
    for name in (
        "TAU_SECRET_KEY",
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "TAU_TOKEN_PEPPERS",
        "TAU_EVIDENCE_SIGNING_KEY",
    )
}
SHOW_SETTINGS = """
import json, django
django.setup()
from django.conf import settings as s
db = s.DATABASES["default"]
print(json.dumps({
    "engine": db["ENGINE"], "name": str(db["NAME"]), "broker": s.CELERY_BROKER_URL,
    "debug": s.DEBUG, "hosts": s.ALLOWED_HOSTS, "secret_len": len(s.SECRET_KEY),
}))
"""


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    env.update({"DJANGO_SETTINGS_MODULE": "portal.settings", "TAU_VAR_DIR": str(tmp_path / "var")})
    env.update(extra)
    return env


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py check --deploy``, failing on warnings too, with exactly ``env``."""
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # starts Python with the settings (0.5-1 s a start)
def test_embedded_default_needs_nothing(tmp_path: Path) -> None:
    result = run_python(SHOW_SETTINGS, clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["engine"] == "django.db.backends.sqlite3"
    assert shown["name"] == str(tmp_path / "var" / "taugrid.sqlite3")
    assert shown["broker"] == "filesystem://"
    assert shown["debug"] is False
    assert shown["hosts"] == ["127.0.0.1", "localhost"]
    secret_file = tmp_path / "var" / "secret_key"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert shown["secret_len"] == len(secret_file.read_text().strip()) >= 50
    # The same secret on the next start: sessions survive a restart.
    again = json.loads(run_python(SHOW_SETTINGS, clean_env(tmp_path)).stdout)
    assert again["secret_len"] == shown["secret_len"]


@pytest.mark.slow  # starts Python with the settings (0.5-1 s a start)
def test_secrets_can_come_from_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s" * 60 + "\n")
    env = clean_env(tmp_path, **{**PRODUCTION_ENV, "TAU_SECRET_KEY": ""})
    del env["TAU_SECRET_KEY"]
    env["TAU_SECRET_KEY_FILE"] = str(secret)
    result = run_python(SHOW_SETTINGS, env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["secret_len"] == 60


@pytest.mark.slow  # starts Python with the settings (0.5-1 s a start)
def test_setting_a_secret_twice_is_refused(tmp_path: Path) -> None:
    env = clean_env(tmp_path, **PRODUCTION_ENV, TAU_SECRET_KEY_FILE="/dev/null")
    result = run_python(SHOW_SETTINGS, env)
    assert result.returncode != 0
    assert "set either TAU_SECRET_KEY or TAU_SECRET_KEY_FILE, not both" in result.stderr


@pytest.mark.slow  # starts Python with the settings (0.5-1 s a start)
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TAU_SECRET_KEY": None}, "TAU_SECRET_KEY (or TAU_SECRET_KEY_FILE) must be set"),
        ({"DATABASE_URL": None}, "DATABASE_URL (or DATABASE_URL_FILE) must be set"),
        ({"DATABASE_URL": "sqlite:////tmp/x.sqlite3"}, "DATABASE_URL must be PostgreSQL"),
        ({"CELERY_BROKER_URL": None}, "CELERY_BROKER_URL (or CELERY_BROKER_URL_FILE) must be set"),
        ({"CELERY_BROKER_URL": "filesystem://"}, "CELERY_BROKER_URL must be redis://"),
        ({"TAU_ALLOWED_HOSTS": None}, "TAU_ALLOWED_HOSTS must list the host names"),
        ({"TAU_TOKEN_PEPPERS": None}, "TAU_TOKEN_PEPPERS (or TAU_TOKEN_PEPPERS_FILE) must be set"),
        (
            {"TAU_EVIDENCE_SIGNING_KEY": None},
            "TAU_EVIDENCE_SIGNING_KEY (or TAU_EVIDENCE_SIGNING_KEY_FILE) must be set",
        ),
        (
            {"TAU_OIDC_ISSUER": "https://idp.example.org"},
            "TAU_OIDC_CLIENT_ID and TAU_OIDC_CLIENT_SECRET",
        ),
        ({"TAU_LOCAL_LOGIN": "false"}, "TAU_LOCAL_LOGIN=false leaves no way to log in"),
        ({"TAU_DEBUG": "true"}, "TAU_DEBUG must be off"),
        ({"TAU_DEBUG": "maybe"}, "TAU_DEBUG must be true or false"),
        ({"TAU_BEHIND_TLS_PROXY": "true"}, "TAU_BEHIND_TLS_PROXY=true needs TAU_TRUSTED_PROXIES"),
        ({"TAU_TRUSTED_PROXIES": "10.0.0.0/8,*"}, "TAU_TRUSTED_PROXIES: '*' is not an IP"),
        ({"TAU_TRUSTED_PROXIES": "10.0.0.1/8"}, "TAU_TRUSTED_PROXIES: '10.0.0.1/8' is not"),
        ({"TAU_INSTALLATION": "Blue_Portal"}, "TAU_INSTALLATION must be a DNS label"),
    ],
)
def test_production_refuses_unsafe_or_missing_settings(
    tmp_path: Path, change: dict[str, str | None], message: str
) -> None:
    env = clean_env(tmp_path, **PRODUCTION_ENV)
    for key, value in change.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    result = run_python(SHOW_SETTINGS, env)
    assert result.returncode != 0
    assert message in result.stderr
    # Nothing was created for a misconfigured production start.
    assert not (tmp_path / "var" / "secret_key").exists()


@pytest.mark.slow  # runs manage.py check --deploy (2-3.5 s)
def test_production_passes_the_deployment_checklist(tmp_path: Path) -> None:
    result = deploy_check(clean_env(tmp_path, **PRODUCTION_ENV))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.slow  # runs manage.py check --deploy (2-3.5 s)
def test_behind_a_trusted_tls_proxy_passes_the_deployment_checklist(tmp_path: Path) -> None:
    env = clean_env(
        tmp_path,
        **PRODUCTION_ENV,
        TAU_BEHIND_TLS_PROXY="true",
        TAU_TRUSTED_PROXIES="10.0.0.7, 2001:db8::/32",
    )
    result = deploy_check(env)
    assert result.returncode == 0, result.stdout + result.stderr
    shown = run_python(
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.TAU_TRUSTED_PROXIES, list(s.SECURE_PROXY_SSL_HEADER), "
        "s.MIDDLEWARE[0]]))",
        env,
    )
    assert json.loads(shown.stdout) == [
        ["10.0.0.7", "2001:db8::/32"],
        ["HTTP_X_FORWARDED_PROTO", "https"],
        "portal.middleware.TrustedProxyMiddleware",
    ]


@pytest.mark.slow  # runs manage.py check --deploy (2-3.5 s)
def test_the_deployment_checklist_would_catch_a_weak_setting(tmp_path: Path) -> None:
    """The previous test is meaningful only if the checklist does fail on a bad setting."""
    env = clean_env(tmp_path, **PRODUCTION_ENV, TAU_HSTS_SECONDS="0")
    result = deploy_check(env)
    assert result.returncode != 0
    assert "security.W004" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("url", "vendor", "name"),
    [
        ("postgres://u:p%40ss@db:5433/tau?sslmode=require", "postgresql", "tau"),
        ("sqlite:////abs/path.sqlite3", "sqlite", "/abs/path.sqlite3"),
        ("sqlite:///relative.sqlite3", "sqlite", "relative.sqlite3"),
    ],
)
def test_database_urls(url: str, vendor: str, name: str) -> None:
    parsed = parse_database_url(url)
    assert parsed.vendor == vendor
    assert parsed.settings["NAME"] == name
    if vendor == "postgresql":
        assert parsed.settings["PASSWORD"] == "p@ss"
        assert parsed.settings["PORT"] == "5433"
        assert parsed.settings["OPTIONS"] == {"sslmode": "require"}


def test_a_pool_replaces_kept_connections_on_postgresql_only() -> None:
    pooled = parse_database_url(
        "postgres://u:p@db/tau?sslmode=require", conn_max_age=60, pool_size=4
    ).settings
    assert pooled["OPTIONS"] == {
        "sslmode": "require",
        "pool": {"min_size": 1, "max_size": 4, "timeout": 30},
    }
    assert pooled["CONN_MAX_AGE"] == 0  # Django refuses a pool with kept connections
    assert pooled["CONN_HEALTH_CHECKS"] is False
    kept = parse_database_url("postgres://u:p@db/tau", conn_max_age=60).settings
    assert kept["OPTIONS"] == {}
    assert kept["CONN_MAX_AGE"] == 60
    sqlite = parse_database_url("sqlite:////a.sqlite3", pool_size=4).settings
    assert isinstance(sqlite["OPTIONS"], dict)
    assert "pool" not in sqlite["OPTIONS"]


@pytest.mark.parametrize("url", ["mysql://x/y", "postgres://host/", "sqlite://"])
def test_bad_database_urls_say_what_is_wrong(url: str) -> None:
    with pytest.raises(ImproperlyConfiguredEnv):
        parse_database_url(url)


@pytest.mark.django_db
def test_suite_runs_on_the_database_it_was_given() -> None:
    """In CI the suite must run on PostgreSQL (make test starts one); elsewhere on whatever
    DATABASE_URL names."""
    if os.environ.get("CI"):
        assert connection.vendor == "postgresql"
    expected = (
        parse_database_url(os.environ["DATABASE_URL"]).vendor
        if os.environ.get("DATABASE_URL")
        else "sqlite"
    )
    assert connection.vendor == expected


def test_every_environment_variable_is_documented() -> None:
    """The configuration table (docs/configuration.md, once the README's) lists every
    variable the settings read."""
    import re

    settings_source = (ROOT / "portal" / "settings.py").read_text()
    read = set(
        re.findall(r'env_(?:str|bool|int|list|secret|required)\("([A-Z0-9_]+)"', settings_source)
    )
    readme = (ROOT / "docs" / "configuration.md").read_text()
    undocumented = sorted(name for name in read if f"`{name}`" not in readme)
    assert len(read) > 10
    assert undocumented == []


@pytest.mark.slow  # starts Python with the settings (0.5-1 s a start)
def test_production_redirects_pages_to_https_but_not_the_api_or_the_probes(
    tmp_path: Path,
) -> None:
    """Run pods report over plain HTTP to the portal's Service (the Helm chart's TAU_API_URL),
    and the orchestrator probes over HTTP: those paths are exempt, the pages are not."""
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.SECURE_SSL_REDIRECT, s.SECURE_REDIRECT_EXEMPT]))"
    )
    done = run_python(code, clean_env(tmp_path, **PRODUCTION_ENV))
    assert done.returncode == 0, done.stderr
    redirect, exempt = json.loads(done.stdout)
    assert redirect is True
    assert exempt == ["^healthz$", "^readyz$", "^metrics$", "^api/"]
