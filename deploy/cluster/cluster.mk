# The real Kubernetes control plane for tests (deploy/cluster/README.md).
# Included from the main Makefile, which defines PYTHON (the project venv's interpreter).
# Binaries are cached under $(TAUGRID_CACHE_DIR) or ~/.cache/taugrid; the running cluster's
# state (kubeconfig, certificates, logs) lives in $(TAUGRID_CLUSTER_DIR) or ~/.cache/taugrid/run.

CLUSTER_TOOL := deploy/cluster/controlplane.py

.PHONY: cluster-build cluster-up cluster-down cluster-status

## Build every component once (kine, Kubernetes, Kueue, KubeRay, KWOK, and helm and Dex for the
## chart's and the login tests; cached).
cluster-build: install
	$(PYTHON) $(CLUSTER_TOOL) build

## Start the control plane and its fake KWOK nodes on 127.0.0.1 (or reuse a running one), with
## a real Ray head and a stand-in for KubeRay's submitter pods so that RayJobs end (Ray is
## installed into its own venv once); prints the kubeconfig path.
cluster-up: install
	$(PYTHON) $(CLUSTER_TOOL) up --ray

## Stop every process of the control plane, free its ports and remove its state.
cluster-down: install
	$(PYTHON) $(CLUSTER_TOOL) down

## Processes, ports and readiness of the running control plane.
cluster-status: install
	$(PYTHON) $(CLUSTER_TOOL) status
