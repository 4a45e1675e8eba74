"""reports: the HTML report a kernel engineer reviews before changing a threshold (python -m reports build)."""
