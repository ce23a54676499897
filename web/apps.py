from django.apps import AppConfig


class WebConfig(AppConfig):
    """The UI shell: the root URLconf, the pages outside any one app, and the commands that
    start the whole portal. It sits on top: it may import every app, and none imports it."""

    name = "web"
    verbose_name = "TauGrid web shell"
