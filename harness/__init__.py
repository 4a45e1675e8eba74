"""Plumbing every command shares: one-line errors and the CLI wrapper, argument parsing, files in and out, the
terminal kept apart from third-party noise. The ground floor: it imports nothing of the project."""
