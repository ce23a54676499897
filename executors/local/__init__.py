"""The local executor: runs execute on this machine, the embedded default. ``backend`` is what
the core asks (submission, cancel, queue positions, the environment a run used); ``agent`` is
the process that does the work (``manage.py run_agent``, started by ``make run``): it admits
queued runs against the workspaces' quotas, prepares each attempt's environment and runs it
in a sandbox, collecting logs, metrics, checkpoints and artifacts."""
