"""The Celery application shared by the web process, workers and beat.

Configuration comes from Django settings (``CELERY_*``). Tasks only call services; anything
long-running (supervising workloads, watching Kubernetes) lives in its own process instead,
because a Celery task can be lost or re-delivered.
"""

import logging
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Celery's Django fix-up runs Django's system checks when a worker starts, which imports every
# URLconf and view (REST framework, the schema generator) into a process that serves none of
# them: ~0.3 s of CPU at each start of each worker. `manage.py migrate` runs them for the same
# settings (make run and the chart's migration job), and so does make run's web server;
# CELERY_SKIP_CHECKS= (empty) runs them here too.
os.environ.setdefault("CELERY_SKIP_CHECKS", "true")

app = Celery("taugrid")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class FilesystemBrokerLogFilter(logging.Filter):
    """Drops kombu's "No hostname was supplied. Reverting to default 'localhost'".

    The embedded default's broker (``filesystem://``) is a folder under ``var/``: it has no
    host, so the warning, logged for every connection by every process, says nothing anyone
    could act on. The logging configuration installs this filter only for that broker; with
    Redis a missing host is a real mistake and stays visible.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No hostname was supplied")
