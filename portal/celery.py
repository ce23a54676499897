"""The Celery application shared by the web process, workers and beat.

Configuration comes from Django settings (``CELERY_*``). Tasks only call services; anything
long-running (supervising workloads, watching Kubernetes) lives in its own process instead,
because a Celery task can be lost or re-delivered.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("taugrid")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
