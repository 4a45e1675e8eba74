"""The table pipeline (python -m tables): a GPU's dispatch table from one command, in legs that resume: sweeps on
several machines, a fit, an out-of-sample check on another machine, the regression baseline, the report; and its
installation as the shipped files. The top floor: its legs call bench, calibrate and reports."""
