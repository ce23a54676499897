from django.apps import AppConfig


class PipelinesConfig(AppConfig):
    name = "pipelines"
    verbose_name = "Pipelines"

    def ready(self) -> None:
        from portal.body_limits import BODY_LIMITS
        from runs.submission import MAX_SUBMISSION_BYTES

        # A pipeline is submitted as a run's project zip is: a form around one zip.
        BODY_LIMITS["api:pipeline-list"] = lambda method: (
            MAX_SUBMISSION_BYTES if method == "POST" else None
        )
        # The run core sits below this app: it announces a run's ending, and the pipeline the
        # run is a stage of is asked to take its next step once that commits.
        from pipelines.orchestration import on_run_ended
        from runs.state import run_ended

        run_ended.connect(on_run_ended, dispatch_uid="pipelines.on_run_ended")
