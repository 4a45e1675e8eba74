"""The evidence store: measured runs filed under evidence/ with their manifest, and the results pages in docs/
written from it. A checkout's tooling (python -m evidence_store), not part of the installed package."""
