"""TauGrid's one adapter for GPU telemetry: Prometheus' HTTP API with dcgm-exporter's metric
names (configurable for other exporters), Ray Serve's own metrics of endpoints on a cluster
(``ray_serve``), and NVML for the GPUs of this machine. Like
:mod:`kube`, it imports nothing from the portal's apps nor Django."""
