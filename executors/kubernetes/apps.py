from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class KubernetesExecutorConfig(AppConfig):
    name = "executors.kubernetes"
    label = "kubernetes_executor"
    verbose_name = "Kubernetes executor"

    def ready(self) -> None:
        from executors.kubernetes import kueue_cluster, kueue_sync
        from runs.selectors import live_run_count
        from telemetry.ray_serve import ServeNames
        from workspaces.signals import kueue_sync_requested

        # A wrong name override would otherwise show only on an endpoint's metrics.
        try:
            ServeNames.from_overrides(settings.TAU_SERVE_METRICS, settings.TAU_SERVE_LABELS)
        except ValueError as error:
            raise ImproperlyConfigured(str(error)) from None

        # Every save or delete that Kueue must follow writes a sync row (on Kubernetes).
        kueue_sync.connect_triggers()
        # The admin's "Sync with Kueue now" (tenancy announces it, this executor does it).
        kueue_sync_requested.connect(
            kueue_sync.request_sync_now, dispatch_uid="executors.kubernetes.sync_now"
        )
        # Archiving a workspace removes its Kueue queues only once none of its runs is live.
        kueue_cluster.register_live_work_check(live_run_count)
