"""The Kubernetes executor: runs as Kueue-admitted Jobs and KubeRay RayJobs (``backend``,
``render``, ``labels``), followed to the end by one watcher per installation (``watcher``,
``status``, ``heartbeat``, ``gpu_faults``), queued as Kueue says (``queue``), and the Kueue
objects the workspaces' quotas become (``kueue``, ``kueue_sync``, ``kueue_cluster``,
``kueue_usage``), with the permissions the portal needs on a cluster (``rbac``) and the check
that it has them (``cluster_check``). Every call to the cluster goes through ``kube``."""
