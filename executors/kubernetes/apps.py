from django.apps import AppConfig


class KubernetesExecutorConfig(AppConfig):
    name = "executors.kubernetes"
    label = "kubernetes_executor"
    verbose_name = "Kubernetes executor"

    def ready(self) -> None:
        from executors.kubernetes import kueue_cluster, kueue_sync
        from runs.selectors import live_run_count

        # Every save or delete that Kueue must follow writes a sync row (on Kubernetes).
        kueue_sync.connect_triggers()
        # Archiving a workspace removes its Kueue queues only once none of its runs is live.
        kueue_cluster.register_live_work_check(live_run_count)
