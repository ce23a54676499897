"""The local executor: a supervising process (``manage.py run_agent``) that runs this
machine's queued local runs as process groups.

It runs arbitrary submitted code as the portal's own user, so it is on in the embedded
default and off in production unless ``TAU_LOCAL_EXECUTOR=true``.

- ``supervisor``: the loop (recover, admit, start, watch, cancel, deadline, finish, stop).
- ``admission``: which queued run may start now, and what the others wait for.
- ``prepare`` and ``environments``: an attempt's directories, code, Python environment
  (cached per requirements) and environment variables.
- ``logs``: the capped per-attempt log. ``collect``: metric rows and checkpoints.
- ``processes``: process groups and their identity, from ``/proc``.

Nothing is imported here: the web process reads ``admission`` (what this machine could ever
run, for submission) without loading the supervisor.
"""
