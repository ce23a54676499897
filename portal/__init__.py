"""The TauGrid Django project: settings, URLs, the Celery app, identity and the UI shell."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
