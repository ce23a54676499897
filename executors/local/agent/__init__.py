"""The local executor: a supervising process (``manage.py run_agent``) that runs this
machine's queued local runs, and its endpoints, as process groups.

It runs arbitrary submitted code on this machine, each attempt in a bubblewrap sandbox
(with a uid of its own when the portal runs as root) and within per-run limits, so it is
on in the embedded default and off in production unless ``TAU_LOCAL_EXECUTOR=true``.

- ``supervisor``: the loop (recover, admit, start, watch, cancel, deadline, finish, stop).
- ``admission``: which queued run may start now, and what the others wait for.
- ``prepare`` and ``environments``: an attempt's directories, code, Python environment
  (cached per requirements) and environment variables.
- ``sandbox``: what an attempt sees (bubblewrap), and the probe for it at start;
  ``seccomp``: the filter every sandboxed command runs under (no namespaces, mounts,
  keyrings or other escape calls).
- ``run_limits``: what one attempt may use (memory, processes, disk) and what holds it to
  that on this machine; ``cgroups``: each attempt's cgroup, where the machine gives them.
- ``wrapper``: runs the workload inside it, keeps its capped log and writes its outcome;
  ``outcomes`` reads that back (also after a crash of the agent).
- ``collect``: metric rows and checkpoints.
- ``processes``: process groups and their identity, from ``/proc``.
- ``endpoints``: the endpoints' generations, each a Ray Serve application on loopback
  (``tau.serving``), supervised beside the runs; ``endpoint_files``: their folders, the
  instructions the backend hands over and what each generation's runner reports.

Nothing is imported here: the web process reads ``admission`` (what this machine could ever
run, for submission) and ``endpoint_files`` (an endpoint's logs and metrics) without loading
the supervisor.
"""
