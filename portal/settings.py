"""Django settings for TauGrid, read from the environment.

With nothing set you get the *embedded default*: SQLite, a Celery broker on the local
filesystem and a generated secret key, everything under ``var/``, so ``make run`` needs no
service at all. ``TAU_ENV=production`` removes every default that is only safe on one
machine: secrets, PostgreSQL and Redis must be given, and ``manage.py check --deploy``
passes. docs/configuration.md lists every variable read here.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import zoneinfo
from pathlib import Path

import django_stubs_ext
from csp.constants import NONE, SELF

from portal.endpoint_routes import endpoint_route
from portal.env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_int,
    env_list,
    env_secret,
    env_str,
    parse_database_url,
)

# Lets code subscript Django's generic classes at runtime (QuerySet[Run]) for the type checker.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

TAU_ENV = env_str("TAU_ENV", "development") or "development"
if TAU_ENV not in {"development", "production"}:
    raise ImproperlyConfiguredEnv(f"TAU_ENV must be development or production, got {TAU_ENV!r}")
PRODUCTION = TAU_ENV == "production"

# Everything the embedded default writes (database, broker queue, secret, logs) stays here.
VAR_DIR = Path(env_str("TAU_VAR_DIR", str(BASE_DIR / "var")) or BASE_DIR / "var").resolve()


def _local_secret(filename: str) -> str:
    """A secret for this checkout only, generated once and kept in var/ (never in the
    repository). Only used outside production."""
    path = VAR_DIR / filename
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    # O_EXCL: two processes starting at once must not each write a different key.
    try:
        with open(path, "x", encoding="utf-8", opener=_private_opener) as handle:
            handle.write(key)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    return key


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


_secret = env_secret("TAU_SECRET_KEY")
if _secret is None:
    if PRODUCTION:
        raise ImproperlyConfiguredEnv(
            "TAU_SECRET_KEY (or TAU_SECRET_KEY_FILE) must be set when TAU_ENV=production; "
            'generate one with: python -c "import secrets; print(secrets.token_urlsafe(50))"'
        )
    _secret = _local_secret("secret_key")
SECRET_KEY = _secret

DEBUG = env_bool("TAU_DEBUG", False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfiguredEnv("TAU_DEBUG must be off when TAU_ENV=production")

ALLOWED_HOSTS = env_list("TAU_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfiguredEnv(
        "TAU_ALLOWED_HOSTS must list the host names the portal is served under, "
        "e.g. TAU_ALLOWED_HOSTS=taugrid.example.org"
    )
CSRF_TRUSTED_ORIGINS = env_list("TAU_CSRF_TRUSTED_ORIGINS", [])
# The proxies (addresses or networks) whose X-Forwarded-For and X-Forwarded-Proto are believed
# (portal.middleware.TrustedProxyMiddleware); from anyone else both headers are dropped.
TAU_TRUSTED_PROXIES = env_list("TAU_TRUSTED_PROXIES", [])
for _proxy in TAU_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy)
    except ValueError:
        raise ImproperlyConfiguredEnv(
            f"TAU_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network "
            "(e.g. 10.0.0.7 or 10.0.0.0/24, without host bits)"
        ) from None

INSTALLED_APPS = [
    "portal.admin_site.TauGridAdminConfig",  # django.contrib.admin, with TauGrid's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "template_partials",
    "csp",
    # Bottom to top (docs/layout.md): the kernel, then the apps, then the UI shell.
    "portal",
    "workspaces",
    "identity",
    "runs",
    "catalog",
    "serving",
    "executors.kubernetes",
    "executors.local",
    "evidence",
    "gpus",
    "accounting",
    "notifications",
    "pipelines",
    "web",
]

MIDDLEWARE = [
    # First: who the client is, and whether it came over https, as a trusted proxy says.
    "portal.middleware.TrustedProxyMiddleware",
    "portal.middleware.RequestIdMiddleware",
    "portal.body_limits.JSONBodySizeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Before the CSRF check, which reads the whole form: an upload too large to be accepted
    # is refused from its Content-Length, unread.
    "runs.submission.SubmissionSizeMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "portal.middleware.PortalCSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "identity.oidc.OIDCSessionRefreshMiddleware",
    "portal.middleware.AuditContextMiddleware",
]

ROOT_URLCONF = "web.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "web.context_processors.navigation",
                "identity.context_processors.sso_problem",
            ],
            "builtins": ["django.contrib.humanize.templatetags.humanize"],
        },
    },
]

# --- Database -----------------------------------------------------------------------------
_database_url = env_secret("DATABASE_URL")
if _database_url is None:
    if PRODUCTION:
        raise ImproperlyConfiguredEnv(
            "DATABASE_URL (or DATABASE_URL_FILE) must be set when TAU_ENV=production, "
            "e.g. postgres://taugrid:secret@db.internal:5432/taugrid"
        )
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    _database_url = f"sqlite:///{VAR_DIR / 'taugrid.sqlite3'}"
_database = parse_database_url(
    _database_url,
    conn_max_age=env_int("TAU_DB_CONN_MAX_AGE", 60 if PRODUCTION else 0, minimum=0),
    pool_size=env_int("TAU_DB_POOL_SIZE", 0, minimum=0),
)
if PRODUCTION and _database.vendor != "postgresql":
    raise ImproperlyConfiguredEnv("DATABASE_URL must be PostgreSQL when TAU_ENV=production")
DATABASES = {"default": _database.settings}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Celery ---------------------------------------------------------------------------------
_broker_url = env_secret("CELERY_BROKER_URL")
if _broker_url is None:
    if PRODUCTION:
        raise ImproperlyConfiguredEnv(
            "CELERY_BROKER_URL (or CELERY_BROKER_URL_FILE) must be set when TAU_ENV=production, "
            "e.g. redis://redis.internal:6379/0"
        )
    _broker_url = "filesystem://"
if PRODUCTION and not _broker_url.startswith(("redis://", "rediss://")):
    raise ImproperlyConfiguredEnv("CELERY_BROKER_URL must be redis:// or rediss:// in production")
CELERY_BROKER_URL = _broker_url
if _broker_url.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "celery" / "queue"
    _processed_dir = VAR_DIR / "celery" / "processed"
    _control_dir = VAR_DIR / "celery" / "control"
    for _folder in (_queue_dir, _processed_dir, _control_dir):
        _folder.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_processed_dir),
        "control_folder": str(_control_dir),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Unacknowledged tasks come back after this long; tasks are idempotent and short.
        "visibility_timeout": env_int("TAU_CELERY_VISIBILITY_TIMEOUT", 3600, minimum=60),
        "socket_connect_timeout": 5,
        "socket_timeout": 10,
        # Publishing gives up quickly when Redis is down: the outbox row is the durable
        # record and the reconciler delivers it later, so a request must not hang on it.
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 1,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
# Notifications (webhook POSTs, e-mails) go to a queue of their own, consumed by a worker of
# their own (`celery worker -Q notifications`: the notifier of make run and of the chart), so
# that a slow endpoint never holds up run hand-off or evidence sealing; everything else stays
# on the default queue, which the main worker consumes (`-Q celery`).
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_ROUTES = {"notifications.tasks.*": {"queue": "notifications"}}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # The outbox relay: anything a lost task or a broker outage left undelivered.
    "reconcile-deliveries": {
        "task": "runs.tasks.reconcile_deliveries",
        "schedule": float(env_int("TAU_RECONCILE_SECONDS", 15, minimum=1)),
    },
    # The same for endpoints: their backends' instructions (serving.delivery).
    "reconcile-endpoint-deliveries": {
        "task": "serving.tasks.reconcile_deliveries",
        "schedule": float(env_int("TAU_RECONCILE_SECONDS", 15, minimum=1)),
    },
    # The same for evidence: seals a lost task, a broker outage or a crash left unsealed.
    "reconcile-seals": {
        "task": "evidence.tasks.reconcile_seals",
        "schedule": float(env_int("TAU_RECONCILE_SECONDS", 15, minimum=1)),
    },
    # A step for every running pipeline: a lost message, an endpoint stage become ready.
    "reconcile-pipelines": {
        "task": "pipelines.tasks.reconcile_pipelines",
        "schedule": float(env_int("TAU_RECONCILE_SECONDS", 15, minimum=1)),
    },
    # Dataset and model versions a dead process left on the way (catalog.sweep).
    "sweep-catalog-versions": {"task": "catalog.tasks.sweep_versions", "schedule": 60.0},
    # Copies of an S3 store's files this machine fetched for its runs, no longer linked by one.
    "trim-catalog-cache": {"task": "catalog.tasks.trim_cache", "schedule": 3600.0},
}
CELERY_TIMEZONE = "UTC"

# --- Cache (rate limits, OIDC provider metadata) --------------------------------------------
# Shared between processes: Redis when there is one, files under var/ otherwise.
_cache_url = env_secret("TAU_CACHE_URL") or (
    _broker_url if _broker_url.startswith(("redis://", "rediss://")) else None
)
if _cache_url:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _cache_url,
            # Several installations (or test portals) can share one Redis under their own prefix.
            "KEY_PREFIX": env_str("TAU_CACHE_KEY_PREFIX", "taugrid"),
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# --- Auth and sessions ----------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Username and password, for bootstrap and small installations; can be switched off once
# OpenID Connect is configured.
TAU_LOCAL_LOGIN = env_bool("TAU_LOCAL_LOGIN", True)

# OpenID Connect (identity/oidc.py). Endpoints and keys come from the provider's
# discovery document at <issuer>/.well-known/openid-configuration.
TAU_OIDC_ISSUER = (env_str("TAU_OIDC_ISSUER", "") or "").rstrip("/")
TAU_OIDC_ENABLED = bool(TAU_OIDC_ISSUER)
TAU_OIDC_PROVIDER_NAME = env_str("TAU_OIDC_PROVIDER_NAME", "your organisation") or "SSO"
TAU_OIDC_SIGNING_ALGORITHMS = env_list("TAU_OIDC_SIGNING_ALGORITHMS", ["RS256", "ES256"])
TAU_OIDC_USERNAME_CLAIM = env_str("TAU_OIDC_USERNAME_CLAIM", "preferred_username") or "sub"
TAU_OIDC_EMAIL_CLAIM = env_str("TAU_OIDC_EMAIL_CLAIM", "email") or "email"
TAU_OIDC_NAME_CLAIM = env_str("TAU_OIDC_NAME_CLAIM", "name") or "name"
TAU_OIDC_GROUPS_CLAIM = env_str("TAU_OIDC_GROUPS_CLAIM", "groups") or "groups"
TAU_OIDC_STAFF_GROUPS = env_list("TAU_OIDC_STAFF_GROUPS", [])
TAU_OIDC_SUPERUSER_GROUPS = env_list("TAU_OIDC_SUPERUSER_GROUPS", [])
# "group=workspace:role" pairs, e.g. "vision-leads=vision:admin,vision=vision:researcher".
TAU_OIDC_WORKSPACE_ROLES = env_list("TAU_OIDC_WORKSPACE_ROLES", [])
TAU_OIDC_CA_BUNDLE = env_str("TAU_OIDC_CA_BUNDLE", "") or None
TAU_OIDC_PROVIDER_LOGOUT = env_bool("TAU_OIDC_PROVIDER_LOGOUT", True)
OIDC_RP_CLIENT_ID = env_str("TAU_OIDC_CLIENT_ID", "") or ""
OIDC_RP_CLIENT_SECRET = env_secret("TAU_OIDC_CLIENT_SECRET") or ""
OIDC_RP_SCOPES = env_str("TAU_OIDC_SCOPES", "openid email profile") or "openid"
OIDC_RP_SIGN_ALGO = "RS256"  # placeholder for the library; the allowed list above decides
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # needed to end the provider's session at logout
OIDC_TOKEN_USE_BASIC_AUTH = env_bool("TAU_OIDC_CLIENT_SECRET_BASIC", True)
OIDC_TIMEOUT = 10
OIDC_VERIFY_SSL = TAU_OIDC_CA_BUNDLE or True
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("TAU_OIDC_RENEW_SECONDS", 15 * 60, minimum=60)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
LOGIN_REDIRECT_URL_FAILURE = "/login/?oidc=failed"
if TAU_OIDC_ENABLED and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ImproperlyConfiguredEnv(
        "TAU_OIDC_ISSUER is set, so TAU_OIDC_CLIENT_ID and TAU_OIDC_CLIENT_SECRET "
        "(or TAU_OIDC_CLIENT_SECRET_FILE) must be set too"
    )
if not TAU_LOCAL_LOGIN and not TAU_OIDC_ENABLED:
    raise ImproperlyConfiguredEnv(
        "TAU_LOCAL_LOGIN=false leaves no way to log in: configure TAU_OIDC_ISSUER first"
    )
AUTHENTICATION_BACKENDS = [
    *(["identity.oidc.OIDCBackend"] if TAU_OIDC_ENABLED else []),
    *(["django.contrib.auth.backends.ModelBackend"] if TAU_LOCAL_LOGIN else []),
]

# API tokens (identity/tokens.py): only an HMAC of the secret is stored, keyed with a
# server-side pepper. Peppers are numbered ("2:new-pepper,1:old-pepper"); the highest number
# signs new tokens, the others still verify old ones until they are removed.
_peppers = env_secret("TAU_TOKEN_PEPPERS")
if _peppers is None:
    if PRODUCTION:
        raise ImproperlyConfiguredEnv(
            "TAU_TOKEN_PEPPERS (or TAU_TOKEN_PEPPERS_FILE) must be set when TAU_ENV=production, "
            "e.g. TAU_TOKEN_PEPPERS=1:<32+ random characters>"
        )
    _peppers = f"1:{_local_secret('token_pepper')}"
TAU_TOKEN_PEPPERS = _peppers
TAU_TOKEN_DEFAULT_DAYS = env_int("TAU_TOKEN_DEFAULT_DAYS", 90, minimum=1)
TAU_TOKEN_MAX_DAYS = env_int("TAU_TOKEN_MAX_DAYS", 365, minimum=1)
TAU_AUTH_FAILURES_PER_ADDRESS = env_int("TAU_AUTH_FAILURES_PER_ADDRESS", 30, minimum=1)
TAU_AUTH_FAILURES_PER_KEY = env_int("TAU_AUTH_FAILURES_PER_KEY", 10, minimum=1)
TAU_AUTH_FAILURE_WINDOW_SECONDS = env_int("TAU_AUTH_FAILURE_WINDOW_SECONDS", 300, minimum=10)
# Password login (identity/login_throttle.py, whose docstring gives the design and the bound):
# failures for one account from one address within the window above pause that account's
# password login from that address for the lockout time; failures in a row for one account
# slow its logins from browsers it never logged in from (a wait from BACKOFF_SECONDS doubling
# up to the lockout time); past the failures from one address within the window, one failure
# for an account pauses it there. Browsers that logged in before (a signed cookie kept for
# DEVICE_DAYS) are never paused or slowed by others' failures.
TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT_ADDRESS = env_int(
    "TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT_ADDRESS", 5, minimum=1
)
TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT = env_int("TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT", 10, minimum=1)
TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS = env_int("TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS", 50, minimum=1)
TAU_AUTH_LOGIN_LOCKOUT_SECONDS = env_int("TAU_AUTH_LOGIN_LOCKOUT_SECONDS", 900, minimum=10)
TAU_AUTH_LOGIN_BACKOFF_SECONDS = env_int("TAU_AUTH_LOGIN_BACKOFF_SECONDS", 60, minimum=1)
TAU_AUTH_LOGIN_DEVICE_DAYS = env_int("TAU_AUTH_LOGIN_DEVICE_DAYS", 180, minimum=1)
SESSION_COOKIE_AGE = env_int("TAU_SESSION_AGE_SECONDS", 60 * 60 * 12, minimum=300)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = False  # HTMX reads the token from the page, not the cookie.

# --- Security headers ----------------------------------------------------------------------
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("TAU_SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("TAU_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TAU_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("TAU_HSTS_PRELOAD", True)
    # Behind a TLS-terminating proxy the portal only sees http; trust its header if told to,
    # and only from TAU_TRUSTED_PROXIES (the middleware drops it from anyone else).
    if env_bool("TAU_BEHIND_TLS_PROXY", False):
        if not TAU_TRUSTED_PROXIES:
            raise ImproperlyConfiguredEnv(
                "TAU_BEHIND_TLS_PROXY=true needs TAU_TRUSTED_PROXIES: the addresses of the "
                "proxy whose X-Forwarded-Proto is believed (from anyone else it is ignored)"
            )
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # /healthz and /readyz are probed over plain HTTP by the orchestrator, and /metrics is
    # scraped so inside the cluster (a redirect would not protect its token: it is sent first).
    # The API likewise: run pods report to the portal's Service over plain HTTP inside the
    # cluster (TAU_API_URL), and every API credential is a bearer token sent with the first
    # request, which a redirect comes too late to protect. Browsers' session cookies are
    # Secure (never sent over HTTP), and HSTS keeps browsers on HTTPS.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^api/"]

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        # plotly.js adds an empty <style> element and fills it through the CSSOM (which CSP
        # does not govern); the hash of the empty string allows exactly that element.
        "style-src": [SELF, "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# --- Internationalisation and static files -------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The image collects them at build time outside VAR_DIR (deploy/Containerfile).
STATIC_ROOT = Path(env_str("TAU_STATIC_ROOT", "") or VAR_DIR / "staticfiles").resolve()
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "portal.staticfiles.PackagedAssetsFinder",
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
# Outside production the files are served straight from the apps and STATICFILES_DIRS.
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = not PRODUCTION

# --- Request bodies -------------------------------------------------------------------------
# Form fields and JSON bodies (the API's JSON parser checks this too): Django's default.
DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 2**19  # 2.5 MiB
# Smaller uploads stay in memory; larger ones go to a temporary file, of which no more than
# one byte past the largest acceptable upload (a code bundle) is ever written. Submissions
# declaring more than a bundle, a spec and their form are refused unread (SubmissionSize-
# Middleware above).
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 2**19
FILE_UPLOAD_HANDLERS = [
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "runs.bundles.BoundedUploadHandler",
]

# --- The embedded default's web server (make run: web/http_server.py, web/asgi.py) ----------
# uvicorn serving web.asgi.application: a request's headers must be in within
# TAU_HTTP_HEADER_SECONDS, and its body within TAU_HTTP_READ_SECONDS after them (plus one
# second per MiB it declares); slower clients get a 408. Production runs gunicorn behind a
# buffering proxy (docs/operations.md) and does not read these.
ASGI_APPLICATION = "web.asgi.application"
TAU_HTTP_HEADER_SECONDS = env_int("TAU_HTTP_HEADER_SECONDS", 10, minimum=1)
TAU_HTTP_READ_SECONDS = env_int("TAU_HTTP_READ_SECONDS", 30, minimum=1)

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    # The token class comes first: its WWW-Authenticate header makes anonymous calls 401.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "identity.tokens.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "identity.tokens.TokenScopePermission",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only: a form or multipart body carries text alone, so a mapping, a list or null
    # sent that way would be dropped or changed, and a write that claims success must store
    # or refuse. Routes that take files say so themselves (a submission, an artifact).
    "DEFAULT_PARSER_CLASSES": ["portal.api.BoundedJSONParser"],
    # OPTIONS describes each write by the serializer its view names for that write.
    "DEFAULT_METADATA_CLASS": "portal.api.ApiMetadata",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Every refusal in one shape, {"detail": "…"} (and the fields at fault on a 400).
    "EXCEPTION_HANDLER": "portal.api.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.CursorPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "TauGrid API",
    "DESCRIPTION": "Submit and follow AI training runs on shared GPU clusters.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": [
        "rest_framework.permissions.IsAuthenticated",
        "identity.tokens.TokenScopePermission",
    ],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # What Django's converters match, so that a client is told which names can exist.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.add_problem_components",
        "portal.api.describe_refusals",
    ],
    # Requests and answers have components of their own, so that what a request may hold is
    # stated for requests: fields that may not be blank say so (minLength 1), as the server
    # refuses them, without claiming it of every answer's text.
    "COMPONENT_SPLIT_REQUEST": True,
    "PATH_CONVERTER_OVERRIDES": {
        "slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
        "str": {"type": "string", "pattern": "^[^/]+$"},
    },
    "ENUM_NAME_OVERRIDES": {
        "RunStateEnum": "runs.models.RunState",
        "AttemptStateEnum": "runs.models.RunAttempt.State",
        "VersionStateEnum": "catalog.models.AssetVersion.State",
        "VersionSourceEnum": "catalog.models.AssetVersion.Source",
        "DeclaredSourceEnum": [("upload", "upload"), ("run", "run")],
    },
}

# --- Logging --------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "portal.request_id.RequestIdLogFilter"},
        # A refused request (4xx) is one line, not a traceback; 5xx keep theirs.
        "client_errors": {"()": "portal.request_id.ClientErrorLogFilter"},
        "filesystem_broker": {"()": "portal.celery.FilesystemBrokerLogFilter"},
    },
    "formatters": {
        "plain": {
            "format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["client_errors", "request_id"],
        },
    },
    "root": {"handlers": ["console"], "level": env_str("TAU_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # httpx logs every request at INFO (Prometheus is asked several times a page).
        "httpx": {"level": "WARNING"},
        # The filesystem broker has no host; kombu's warning about it means nothing here.
        **(
            {"kombu.connection": {"filters": ["filesystem_broker"]}}
            if _broker_url.startswith("filesystem://")
            else {}
        ),
    },
}

# --- Runs ----------------------------------------------------------------------------------
# The image a run gets when neither its tau.yaml nor its workspace names one.
TAU_DEFAULT_IMAGE = env_str("TAU_DEFAULT_IMAGE", "python:3.11-slim") or "python:3.11-slim"
# Registries images may come from (empty: any).
TAU_IMAGE_REGISTRIES = env_list("TAU_IMAGE_REGISTRIES", [])
# No node offers more GPUs than this; a worker asking for more could never be placed.
TAU_MAX_GPUS_PER_NODE = env_int("TAU_MAX_GPUS_PER_NODE", 8, minimum=0)
# Where runs execute: "local" (this machine, the embedded default) or "kubernetes".
TAU_BACKEND = env_str("TAU_BACKEND", "kubernetes" if PRODUCTION else "local") or "local"
if TAU_BACKEND not in {"local", "kubernetes"}:
    raise ImproperlyConfiguredEnv(f"TAU_BACKEND must be local or kubernetes, got {TAU_BACKEND!r}")
# This installation's name on its cluster: every object TauGrid makes for Kueue carries it
# (label taugrid.io/installation), and TauGrid changes or removes only objects with its own,
# so two portals (a staging one, a second region) can share one cluster. Objects made before
# installations had names, without the label, are the "default" installation's.
TAU_INSTALLATION = env_str("TAU_INSTALLATION", "default") or "default"
if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", TAU_INSTALLATION):
    raise ImproperlyConfiguredEnv(
        f"TAU_INSTALLATION must be a DNS label (lowercase letters, digits and '-', at most 63 "
        f"characters, a letter or digit at both ends), got {TAU_INSTALLATION!r}"
    )
# The class of each backend (runs/backends/registry.py): the run core never imports one.
TAU_BACKEND_CLASSES = {
    "local": "executors.local.backend.LocalBackend",
    "kubernetes": "executors.kubernetes.backend.KubernetesBackend",
}
# Telling the backend (runs/delivery.py): a failed try is tried again after
# TAU_DELIVERY_RETRY_SECONDS, doubling up to TAU_DELIVERY_RETRY_MAX_SECONDS; after
# TAU_DELIVERY_MAX_TRIES tries the run fails (class infrastructure) with the backend's message.
TAU_DELIVERY_RETRY_SECONDS = env_int("TAU_DELIVERY_RETRY_SECONDS", 10, minimum=1)
TAU_DELIVERY_RETRY_MAX_SECONDS = env_int("TAU_DELIVERY_RETRY_MAX_SECONDS", 300, minimum=1)
TAU_DELIVERY_MAX_TRIES = env_int("TAU_DELIVERY_MAX_TRIES", 10, minimum=1)
# Submissions (runs/submission.py count_submission): at most this many a minute per API token
# (a user's pages count as one more token) and per user over all their tokens and pages; the
# submit page's live check, which runs as people type, at most CHECKS per user. Past a limit:
# 429 with Retry-After, before any of the request is read.
TAU_SUBMISSIONS_PER_MINUTE = env_int("TAU_SUBMISSIONS_PER_MINUTE", 30, minimum=1)
TAU_SUBMISSIONS_PER_MINUTE_PER_USER = env_int("TAU_SUBMISSIONS_PER_MINUTE_PER_USER", 60, minimum=1)
TAU_SUBMIT_CHECKS_PER_MINUTE = env_int("TAU_SUBMIT_CHECKS_PER_MINUTE", 120, minimum=1)
# Endpoints (serving/): the largest request body the portal's proxy route forwards to an
# endpoint (a larger one is a 413, refused from its Content-Length or as it arrives), and how
# long it waits for the endpoint to answer (then a 502).
TAU_ENDPOINT_MAX_BODY_BYTES = env_int("TAU_ENDPOINT_MAX_BODY_BYTES", 10 * 2**20, minimum=1)
TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS = env_int("TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS", 300, minimum=1)
# A running endpoint no request has reached for this many hours is shown as idle (its pages,
# the platform admin's list): it holds its GPUs for nothing.
TAU_ENDPOINT_IDLE_HOURS = env_int("TAU_ENDPOINT_IDLE_HOURS", 24, minimum=1)
# Endpoints on Kubernetes reached from outside the cluster (portal/endpoint_routes.py): none
# (the in-cluster Service only), an Ingress or a Gateway API HTTPRoute per endpoint, for the
# host TAU_ENDPOINT_HOST makes from the endpoint's and the workspace's names, with TLS. Checked
# here: a wrong value stops the portal at start-up.
TAU_ENDPOINT_ROUTE = endpoint_route(
    kind=env_str("TAU_ENDPOINT_ROUTE", "none") or "none",
    host=env_str("TAU_ENDPOINT_HOST", "") or "",
    ingress_class=env_str("TAU_ENDPOINT_INGRESS_CLASS", "") or "",
    tls_secret=env_str("TAU_ENDPOINT_TLS_SECRET", "") or "",
    annotations=env_str("TAU_ENDPOINT_INGRESS_ANNOTATIONS", "") or "",
    gateway=env_str("TAU_ENDPOINT_GATEWAY", "") or "",
)
# Every outbox (portal/outbox.py: deliveries, evidence seals and checks, Kueue syncs): a
# worker's claim on a row holds this long unless renewed (its worker renews it every third of
# this while it works), so a killed worker's row is taken over within this plus
# TAU_RECONCILE_SECONDS.
TAU_CLAIM_LEASE_SECONDS = env_int("TAU_CLAIM_LEASE_SECONDS", 15, minimum=3)
# Artifacts (runs/artifacts.py): the files a run declares in outputs.artifacts are kept up to
# these many bytes per run and per workspace; a file that would pass either is not kept.
TAU_ARTIFACT_MAX_BYTES_PER_RUN = env_int("TAU_ARTIFACT_MAX_BYTES_PER_RUN", 2**30, minimum=0)
TAU_ARTIFACT_MAX_BYTES_PER_WORKSPACE = env_int(
    "TAU_ARTIFACT_MAX_BYTES_PER_WORKSPACE", 50 * 2**30, minimum=0
)
# Datasets and models (catalog/storage.py): where their files are kept, file:///<folder>
# (the embedded default: VAR_DIR/storage) or s3://<bucket>/<prefix> (any S3-compatible store);
# each workspace's files once per SHA-256.
TAU_STORAGE_URL = env_str("TAU_STORAGE_URL", "")
# An S3 store's endpoint (empty: AWS), region, and keys; without keys the AWS SDK's own chain
# (AWS_* variables, a web identity such as IRSA, an instance role). Keys by reference:
# TAU_STORAGE_ACCESS_KEY_ID_FILE and TAU_STORAGE_SECRET_ACCESS_KEY_FILE, both or neither.
TAU_STORAGE_ENDPOINT_URL = env_str("TAU_STORAGE_ENDPOINT_URL", "") or ""
TAU_STORAGE_REGION = env_str("TAU_STORAGE_REGION", "") or ""
TAU_STORAGE_ACCESS_KEY_ID = env_secret("TAU_STORAGE_ACCESS_KEY_ID")
TAU_STORAGE_SECRET_ACCESS_KEY = env_secret("TAU_STORAGE_SECRET_ACCESS_KEY")
if (TAU_STORAGE_ACCESS_KEY_ID is None) != (TAU_STORAGE_SECRET_ACCESS_KEY is None):
    raise ImproperlyConfiguredEnv(
        "TAU_STORAGE_ACCESS_KEY_ID(_FILE) and TAU_STORAGE_SECRET_ACCESS_KEY(_FILE) go together: "
        "set both, or neither to use the AWS SDK's own credentials"
    )
# The most files one version may hold, the largest one file may be, and the largest piece of
# a file one upload request may carry (catalog/uploads.py; a client sends a file in pieces).
TAU_DATA_MAX_FILES = env_int("TAU_DATA_MAX_FILES", 1_000_000, minimum=1)
TAU_DATA_MAX_FILE_BYTES = env_int("TAU_DATA_MAX_FILE_BYTES", 100 * 2**30, minimum=1)
TAU_DATA_UPLOAD_PIECE_BYTES = env_int("TAU_DATA_UPLOAD_PIECE_BYTES", 64 * 2**20, minimum=2**16)
# Where datasets may be registered from in place (catalog/prefixes.py, `tau data dataset
# register`): each workspace's folder is <this>/<workspace slug>/, e.g. a PersistentVolumeClaim
# mounted there in the portal's pods. Empty: VAR_DIR/prefixes.
TAU_DATA_PREFIX_DIR = env_str("TAU_DATA_PREFIX_DIR", "") or ""
# Versions from s3:// (catalog/s3_ingest.py): the buckets, or bucket/prefix/ areas, any
# workspace may read ({workspace} stands for its slug); empty: none. The store's own area never.
TAU_DATA_SOURCE_BUCKETS = env_list("TAU_DATA_SOURCE_BUCKETS", [])
# The S3 service they are read from: the store's (TAU_STORAGE_ENDPOINT_URL, _REGION and keys)
# unless one of these is set; then these alone (no endpoint: AWS; no keys: the SDK's chain).
TAU_DATA_SOURCE_ENDPOINT_URL = env_str("TAU_DATA_SOURCE_ENDPOINT_URL", "") or ""
TAU_DATA_SOURCE_REGION = env_str("TAU_DATA_SOURCE_REGION", "") or ""
TAU_DATA_SOURCE_ACCESS_KEY_ID = env_secret("TAU_DATA_SOURCE_ACCESS_KEY_ID")
TAU_DATA_SOURCE_SECRET_ACCESS_KEY = env_secret("TAU_DATA_SOURCE_SECRET_ACCESS_KEY")
if (TAU_DATA_SOURCE_ACCESS_KEY_ID is None) != (TAU_DATA_SOURCE_SECRET_ACCESS_KEY is None):
    raise ImproperlyConfiguredEnv(
        "TAU_DATA_SOURCE_ACCESS_KEY_ID(_FILE) and TAU_DATA_SOURCE_SECRET_ACCESS_KEY(_FILE) go "
        "together: set both, or neither"
    )
# A copy of an S3 store's file that this machine fetched for its runs (VAR_DIR/cache/blobs/)
# is removed once no staged run links it and it was last fetched or used this long ago
# (catalog.tasks.trim_cache, hourly).
TAU_DATA_CACHE_SECONDS = env_int("TAU_DATA_CACHE_SECONDS", 86400, minimum=60)
# A version whose ingest shows no sign of life this long is taken as left by a dead process
# (catalog.sweep.sweep_versions, every minute); an upload no piece reached for the second
# is abandoned.
TAU_DATA_STALE_SECONDS = env_int("TAU_DATA_STALE_SECONDS", 300, minimum=10)
TAU_DATA_UPLOAD_ABANDON_SECONDS = env_int("TAU_DATA_UPLOAD_ABANDON_SECONDS", 3 * 86400, minimum=60)
# Evidence (evidence/keys.py): the Ed25519 key that signs each run's sealed record, a PEM
# private key. Required in production; the embedded default generates one once, into
# VAR_DIR/evidence_signing_key.pem (mode 0600). TAU_EVIDENCE_PUBLIC_KEYS_FILE is a keyring
# (docs/evidence.md) of the public keys signed with before a rotation: they stay published
# at /api/v1/evidence/keys/ so that older records keep verifying.
TAU_EVIDENCE_SIGNING_KEY = env_secret("TAU_EVIDENCE_SIGNING_KEY")
if TAU_EVIDENCE_SIGNING_KEY is None and PRODUCTION:
    raise ImproperlyConfiguredEnv(
        "TAU_EVIDENCE_SIGNING_KEY (or TAU_EVIDENCE_SIGNING_KEY_FILE) must be set when "
        "TAU_ENV=production; generate one with: openssl genpkey -algorithm ed25519"
    )
TAU_EVIDENCE_GENERATED_KEY_PATH = VAR_DIR / "evidence_signing_key.pem"
TAU_EVIDENCE_PUBLIC_KEYS_FILE = env_str("TAU_EVIDENCE_PUBLIC_KEYS_FILE", "") or ""
# Keeping Kueue in step with the workspaces (executors/kubernetes/kueue_sync.py, Kubernetes backend
# only): a failed sync is tried again after TAU_KUEUE_SYNC_RETRY_SECONDS, doubling up to
# TAU_KUEUE_SYNC_RETRY_MAX_SECONDS, at most TAU_KUEUE_SYNC_MAX_TRIES times; every
# TAU_KUEUE_DRIFT_SECONDS the live objects are compared with TauGrid's and put back.
TAU_KUEUE_SYNC_RETRY_SECONDS = env_int("TAU_KUEUE_SYNC_RETRY_SECONDS", 10, minimum=1)
TAU_KUEUE_SYNC_RETRY_MAX_SECONDS = env_int("TAU_KUEUE_SYNC_RETRY_MAX_SECONDS", 300, minimum=1)
TAU_KUEUE_SYNC_MAX_TRIES = env_int("TAU_KUEUE_SYNC_MAX_TRIES", 10, minimum=1)
TAU_KUEUE_DRIFT_SECONDS = env_int("TAU_KUEUE_DRIFT_SECONDS", 60, minimum=5)
if TAU_BACKEND == "kubernetes":
    CELERY_BEAT_SCHEDULE.update(
        {
            # The Kueue outbox's relay: syncs a lost task, a broker outage or a killed worker
            # left behind, and archived workspaces waiting for their runs.
            "reconcile-kueue-syncs": {
                "task": "executors.kubernetes.tasks.reconcile_kueue_syncs",
                "schedule": float(env_int("TAU_RECONCILE_SECONDS", 15, minimum=1)),
            },
            "check-kueue-drift": {
                "task": "executors.kubernetes.tasks.check_kueue_drift",
                "schedule": float(TAU_KUEUE_DRIFT_SECONDS),
            },
        }
    )
# The Kubernetes watcher (executors/kubernetes/watcher.py, `manage.py run_kube_watcher`): one
# replica acts at a time, holding the Lease taugrid-kube-watcher in TAU_KUBE_WATCHER_LEASE_NAMESPACE
# (the portal's namespace, workspaces.models.PORTAL_NAMESPACE, unless set), renewed every
# fifth of TAU_KUBE_WATCHER_LEASE_SECONDS; a standby takes over once it lapses. Every
# TAU_KUBE_WATCHER_RESYNC_SECONDS each watch is replaced by a full list.
TAU_KUBE_WATCHER_LEASE_NAMESPACE = (
    env_str("TAU_KUBE_WATCHER_LEASE_NAMESPACE", "taugrid") or "taugrid"
)
TAU_KUBE_WATCHER_LEASE_SECONDS = env_int("TAU_KUBE_WATCHER_LEASE_SECONDS", 15, minimum=2)
TAU_KUBE_WATCHER_RESYNC_SECONDS = env_int("TAU_KUBE_WATCHER_RESYNC_SECONDS", 300, minimum=10)
# Namespaces no workspace may be given (workspaces.models.namespace_refusal; glob patterns,
# comma-separated, replacing the defaults): the cluster's and its operators'. The portal's
# own namespace (TAU_KUBE_WATCHER_LEASE_NAMESPACE, and taugrid) is refused whatever this says.
TAU_WORKSPACE_NAMESPACES_DENIED = env_list(
    "TAU_WORKSPACE_NAMESPACES_DENIED",
    [
        "kube-*",
        "default",
        "kueue-system",
        "kuberay-system",
        "ray-system",
        "cert-manager",
        "gpu-operator",
        "monitoring",
        "ingress-nginx",
        "local-path-storage",
        "openshift-*",
    ],
)
# The local executor runs submitted code as the portal's own user: on by default on one
# machine, and only when explicitly enabled in production.
TAU_LOCAL_EXECUTOR = env_bool("TAU_LOCAL_EXECUTOR", not PRODUCTION)
if TAU_BACKEND == "local" and not TAU_LOCAL_EXECUTOR:
    raise ImproperlyConfiguredEnv(
        "TAU_BACKEND=local needs TAU_LOCAL_EXECUTOR=true; it runs submitted code as this "
        "user on this machine, so it must be switched on deliberately in production"
    )
# This machine's resources for local runs (detected when not set).
TAU_LOCAL_CPUS = env_int("TAU_LOCAL_CPUS", os.cpu_count() or 1, minimum=1)
TAU_LOCAL_MEMORY = env_str("TAU_LOCAL_MEMORY", "") or ""
TAU_LOCAL_GPUS = env_int("TAU_LOCAL_GPUS", 0, minimum=0)
TAU_RUN_LOG_MAX_BYTES = env_int("TAU_RUN_LOG_MAX_BYTES", 50 * 2**20, minimum=2**16)
# The resource flavor whose quota rows are a workspace's share of this machine.
TAU_LOCAL_FLAVOR = env_str("TAU_LOCAL_FLAVOR", "local") or "local"
# Where the local executor keeps the runs' Python environments, one per set of requirements
# (executors/local/agent/environments.py): several portals of one machine (the test suite's)
# may share them, so a large requirement (torch) is installed once.
# Unset: VAR_DIR/venvs (executors.local.agent.prepare.venvs_root).
TAU_LOCAL_VENVS_DIR = env_str("TAU_LOCAL_VENVS_DIR", "") or ""
# Seconds between SIGTERM and SIGKILL when the local agent stops a run's processes.
TAU_LOCAL_GRACE_SECONDS = env_int("TAU_LOCAL_GRACE_SECONDS", 10, minimum=0)
# How a running workload reaches the portal's API (TAU_API_URL in its environment).
_port = env_int("PORT", 8000, minimum=1)  # the port `make run` serves on
TAU_API_URL = env_str("TAU_API_URL", "") or f"http://127.0.0.1:{_port}"
# Each local attempt runs in a bubblewrap sandbox (executors/local/agent/sandbox.py): "auto" uses it
# when bwrap works here, "off" never does (as if bwrap were missing).
TAU_LOCAL_SANDBOX = env_str("TAU_LOCAL_SANDBOX", "auto") or "auto"
if TAU_LOCAL_SANDBOX not in {"auto", "off"}:
    raise ImproperlyConfiguredEnv(
        f"TAU_LOCAL_SANDBOX must be auto or off, got {TAU_LOCAL_SANDBOX!r}"
    )
# Without a sandbox the agent runs the workloads of one workspace only, unless this says
# that every workspace's code may run unsandboxed, as the portal's user, on purpose.
TAU_LOCAL_EXECUTOR_UNSANDBOXED = env_bool("TAU_LOCAL_EXECUTOR_UNSANDBOXED", False)
# Per local run (executors/local/agent/run_limits.py): processes and threads together, and the disk
# its folders may hold (a quantity such as 20Gi). Its memory limit comes from its spec.
TAU_LOCAL_RUN_PROCESSES = env_int("TAU_LOCAL_RUN_PROCESSES", 1024, minimum=32)
TAU_LOCAL_RUN_DISK = env_str("TAU_LOCAL_RUN_DISK", "20Gi") or "20Gi"

# --- GPUs: the fleet, its telemetry, GPU efficiency of runs (gpus/, telemetry/) --------------
# Node conditions (set by node-problem-detector plugins) that make a GPU node unhealthy when
# True; any other True condition whose type looks GPU-related (GPU, XID, NVLink, ECC, DCGM,
# IB) is shown as a problem too.
TAU_GPU_HEALTH_CONDITIONS = env_list(
    "TAU_GPU_HEALTH_CONDITIONS",
    [
        "GPUMissing",
        "XIDErrors",
        "NVLinkStatusInactive",
        "IBLinkFlapping",
        "GPUClockThrottling",
        "UnhealthyNvidiaDevicePlugin",
    ],
)
# Cordon a node as soon as one of its GPU conditions turns True (audited, with the reason).
TAU_GPU_AUTO_CORDON = env_bool("TAU_GPU_AUTO_CORDON", False)
# How long the watcher waits after a GPU pod exits non-zero before calling it the program's
# failure, for an XID condition node-problem-detector reports late (executors/kubernetes/status.py).
TAU_XID_SETTLE_SECONDS = env_int("TAU_XID_SETTLE_SECONDS", 30, minimum=0)
# How often the fleet is read from Kubernetes (or NVML) into the database.
TAU_GPU_SYNC_SECONDS = env_int("TAU_GPU_SYNC_SECONDS", 15, minimum=1)
CELERY_BEAT_SCHEDULE["sync-gpu-fleet"] = {
    "task": "gpus.tasks.sync_fleet",
    "schedule": float(TAU_GPU_SYNC_SECONDS),
}
# Prometheus scraping dcgm-exporter: per-GPU telemetry, the run pages' GPU efficiency.
TAU_PROMETHEUS_URL = (env_str("TAU_PROMETHEUS_URL", "") or "").rstrip("/")
TAU_PROMETHEUS_TOKEN = env_secret("TAU_PROMETHEUS_TOKEN")  # sent as a bearer token, if set
TAU_PROMETHEUS_TIMEOUT_SECONDS = env_int("TAU_PROMETHEUS_TIMEOUT_MS", 2000, minimum=100) / 1000
# Answers are cached this long and shared by everyone looking.
TAU_PROMETHEUS_CACHE_SECONDS = env_int("TAU_PROMETHEUS_CACHE_SECONDS", 10, minimum=0)
if TAU_PROMETHEUS_URL or TAU_BACKEND == "local":
    # The fleet's GPU telemetry (Prometheus, or this machine's NVML) read in the background
    # for the fleet page, which then never waits on it (gpus/readings.py).
    CELERY_BEAT_SCHEDULE["refresh-gpu-telemetry"] = {
        "task": "gpus.tasks.refresh_fleet_telemetry",
        "schedule": float(max(5, TAU_PROMETHEUS_CACHE_SECONDS)),
    }
# Another exporter's names: JSON objects mapping TauGrid's fields to its metric and label
# names, e.g. {"utilization": "nvidia_gpu_utilization"} (telemetry/dcgm.py lists the fields).
TAU_DCGM_METRICS = env_str("TAU_DCGM_METRICS", "") or ""
TAU_DCGM_LABELS = env_str("TAU_DCGM_LABELS", "") or ""
# The endpoints' traffic on a cluster comes from Ray Serve's own metrics in that Prometheus,
# found by the target labels the platform's scrape config gives the Ray pods: JSON objects
# naming other metrics or labels, e.g. {"endpoint_id": "endpoint"} (telemetry/ray_serve.py;
# docs/kubernetes.md, "Endpoint metrics").
TAU_SERVE_METRICS = env_str("TAU_SERVE_METRICS", "") or ""
TAU_SERVE_LABELS = env_str("TAU_SERVE_LABELS", "") or ""
# A run that holds GPUs it uses less than this (percent, on average) for this long is
# flagged on its page: the most expensive waste on a shared cluster.
TAU_GPU_IDLE_PERCENT = env_int("TAU_GPU_IDLE_PERCENT", 10, minimum=0)
TAU_GPU_IDLE_MINUTES = env_int("TAU_GPU_IDLE_MINUTES", 15, minimum=1)
# --- Accounting: GPU-hours used, monthly GPU-hour budgets (runs/accounting.py, accounting/) ---
# Months and days of the usage pages, the API and the budgets are this zone's calendar's.
TAU_ACCOUNTING_TIME_ZONE = env_str("TAU_ACCOUNTING_TIME_ZONE", "") or TIME_ZONE
try:
    zoneinfo.ZoneInfo(TAU_ACCOUNTING_TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfiguredEnv(
        f"TAU_ACCOUNTING_TIME_ZONE is {TAU_ACCOUNTING_TIME_ZONE!r}, which is not a time zone; "
        "use an IANA name such as Europe/Berlin or UTC"
    ) from None
# How often running runs' GPU-hours are checked against the budgets' 80% and 100% marks.
TAU_BUDGET_CHECK_SECONDS = env_int("TAU_BUDGET_CHECK_SECONDS", 300, minimum=10)
CELERY_BEAT_SCHEDULE["check-gpu-budgets"] = {
    "task": "accounting.tasks.check_budgets",
    "schedule": float(TAU_BUDGET_CHECK_SECONDS),
}

# /metrics (the portal's own metrics, Prometheus format; web/portal_metrics.py): a scraper sends
# this as its bearer token. Outside production one is generated once into VAR_DIR/metrics-token
# (the curl in docs/operations.md reads it there); in production, without one, /metrics answers
# nobody. Never loopback alone: runs on the embedded default connect from this machine too.
TAU_METRICS_TOKEN = env_secret("TAU_METRICS_TOKEN") or (
    None if PRODUCTION else _local_secret("metrics-token")
)

# --- Notifications: e-mail and webhooks (notifications/) ------------------------------------
# E-mail goes through Django's SMTP backend; with no TAU_EMAIL_HOST no e-mail is sent (webhooks
# still are). TAU_EMAIL_USE_TLS is STARTTLS on the submission port.
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env_str("TAU_EMAIL_HOST", "") or ""
EMAIL_PORT = env_int("TAU_EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("TAU_EMAIL_USER", "") or ""
EMAIL_HOST_PASSWORD = env_secret("TAU_EMAIL_PASSWORD") or ""
EMAIL_USE_TLS = env_bool("TAU_EMAIL_USE_TLS", True)
EMAIL_TIMEOUT = env_int("TAU_EMAIL_TIMEOUT_SECONDS", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("TAU_EMAIL_FROM", "TauGrid <taugrid@localhost>") or "taugrid@localhost"
# The address people reach the portal at, for the links in e-mails and webhook payloads.
TAU_PUBLIC_URL = (env_str("TAU_PUBLIC_URL", "") or TAU_API_URL).rstrip("/")
# A failed delivery (webhook POST or e-mail) is tried again after TAU_NOTIFY_RETRY_SECONDS,
# doubling up to TAU_NOTIFY_RETRY_MAX_SECONDS, and given up after TAU_NOTIFY_MAX_TRIES tries.
TAU_NOTIFY_RETRY_SECONDS = env_int("TAU_NOTIFY_RETRY_SECONDS", 30, minimum=1)
TAU_NOTIFY_RETRY_MAX_SECONDS = env_int("TAU_NOTIFY_RETRY_MAX_SECONDS", 3600, minimum=1)
TAU_NOTIFY_MAX_TRIES = env_int("TAU_NOTIFY_MAX_TRIES", 8, minimum=1)
# run.waiting: told of once per wait, for runs queued longer than this.
TAU_NOTIFY_WAITING_MINUTES = env_int("TAU_NOTIFY_WAITING_MINUTES", 60, minimum=1)
# Seconds one webhook delivery may take in all: resolving, connecting, TLS, sending, and the
# whole answer (a receiver trickling bytes is cut off then too).
TAU_WEBHOOK_TIMEOUT_SECONDS = env_int("TAU_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1)
# Webhooks one workspace may have.
TAU_WEBHOOKS_PER_WORKSPACE = env_int("TAU_WEBHOOKS_PER_WORKSPACE", 20, minimum=1)
# Deliveries to one workspace's webhooks being sent at once (one per endpoint at most): the
# notifier's other slots stay free for everyone else.
TAU_NOTIFY_WORKSPACE_CONCURRENCY = env_int("TAU_NOTIFY_WORKSPACE_CONCURRENCY", 2, minimum=1)
# Webhooks to loopback, private, link-local and other non-public addresses are refused
# (at save and at each delivery) unless this is true.
TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env_bool("TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES", False)
CELERY_BEAT_SCHEDULE["reconcile-notifications"] = {
    "task": "notifications.tasks.reconcile_notifications",
    "schedule": float(env_int("TAU_RECONCILE_SECONDS", 15, minimum=1)),
}
CELERY_BEAT_SCHEDULE["notify-waiting-runs"] = {
    "task": "notifications.tasks.notify_waiting",
    "schedule": 60.0,
}
# --- End of notifications ---------------------------------------------------------------------
