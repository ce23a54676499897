"""GPUs: the fleet of GPU nodes (health, capacity, the runs on them, cordon and uncordon),
their telemetry from Prometheus/DCGM (or NVML on one machine), and GPU efficiency per run.

Node data comes from Kubernetes Node objects and the pods bound to them, copied into
:class:`gpus.models.GpuNode` rows by a periodic sync, so pages read the database (a fixed
number of queries, whatever the fleet's size) and keep showing the last-known state, with a
notice, while the cluster cannot be reached. Telemetry is read from Prometheus in the
background (the fleet) or at page time (a node, a run), one query per metric, cached briefly
and shared by everyone looking.
"""

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class GpusConfig(AppConfig):
    name = "gpus"
    verbose_name = "GPUs"

    def ready(self) -> None:
        # A wrong name override would otherwise fail only when someone opens a GPU page.
        from telemetry.dcgm import MetricNames

        try:
            MetricNames.from_overrides(settings.TAU_DCGM_METRICS, settings.TAU_DCGM_LABELS)
        except ValueError as error:
            raise ImproperlyConfigured(str(error)) from None
