from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    name = "workspaces"
    verbose_name = "Workspaces and quotas"

    def ready(self) -> None:
        from workspaces import kueue_sync

        # Every save or delete that Kueue must follow writes a sync row (on Kubernetes).
        kueue_sync.connect_triggers()
