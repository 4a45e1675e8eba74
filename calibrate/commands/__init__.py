"""calibrate's commands, one module each: `add_parser(sub, parents, ...)` declares its options, `run(args)` runs it
(calibrate/__main__.py only dispatches to those moved here so far)."""
