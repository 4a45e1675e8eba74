"""Diagnostic probes: each answers one question on a GPU and writes its figures to a folder; none is product, none
runs anything at import. The harness's own numbers come from bench run and bench forward."""
