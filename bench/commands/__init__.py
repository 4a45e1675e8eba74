"""One module per bench command: its options (add_parser) and its run (run); options.py holds what several share."""
