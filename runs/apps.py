from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from portal import health
        from runs.health import local_executor_note
        from runs.selectors import live_run_count
        from workspaces import kueue_cluster

        health.add_readiness_note("local_executor", local_executor_note)
        # Archiving a workspace removes its Kueue queues only once none of its runs is live.
        kueue_cluster.register_live_work_check(live_run_count)
