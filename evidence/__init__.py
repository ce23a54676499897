"""Evidence: the sealed, verifiable record of every run.

Config, code, logs, metrics and checkpoints, kept after the cluster objects are gone.
"""
