from django.apps import AppConfig


class LocalExecutorConfig(AppConfig):
    name = "executors.local"
    label = "local_executor"
    verbose_name = "Local executor"
