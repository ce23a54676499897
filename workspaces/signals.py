"""What tenancy announces for an executor to act on: the executor connects its receivers in its
``AppConfig.ready()``, so tenancy never imports one (``tests/test_layering.py``)."""

from __future__ import annotations

from django.dispatch import Signal

#: The platform team asked for a workspace's queues to be brought in step with the cluster now
#: (the admin's "Sync with Kueue now"), with ``workspace`` and ``by`` (the user asking). The
#: Kubernetes executor answers it (``executors.kubernetes.kueue_sync.request_sync_now``).
kueue_sync_requested = Signal()
