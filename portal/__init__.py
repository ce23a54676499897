"""The kernel every other app stands on: settings and the Celery app, tenancy (workspace-
scoped managers that fail closed), the audit trail, middleware, API plumbing, health checks,
the outbox's claims and back-off, and rate limits. It imports no other TauGrid app; the
root URLconf, the pages' shell and the commands that start everything are ``web``'s."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
