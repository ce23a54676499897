"""Notifications: e-mail and webhooks telling people what happened to runs and budgets.

The run core announces its changes of state (``runs.state.run_changed``) and other apps
their notices (``portal.notices.notice``), inside the transaction of the change; this app
writes the deliveries in that transaction and sends them afterwards from Celery, with
retries, so a slow or failing endpoint never holds up a run.
"""

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # Both apps that announce sit below this one and cannot call it: they send signals,
        # and the deliveries are written in the transaction of the change.
        from notifications.receivers import on_notice, on_run_changed
        from portal.notices import notice
        from runs.state import run_changed

        run_changed.connect(on_run_changed, dispatch_uid="notifications.on_run_changed")
        notice.connect(on_notice, dispatch_uid="notifications.on_notice")
