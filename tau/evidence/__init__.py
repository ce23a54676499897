"""The evidence record of a run (docs/evidence.md), client side: the canonical JSON, the event
chain, the keys, the export tar, and the offline verifier (``python -m tau.evidence verify``).

Standard library plus ``cryptography`` only, never Django: a record must be checkable years
later, offline, by someone who does not run (or trust) the portal. The portal imports the
same modules to write records, so writer and verifier cannot drift apart.
"""
