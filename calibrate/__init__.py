"""Calibration: reads bench results and turns them into verdicts, fitted threshold tables, per-GPU baselines and
regression checks (python -m calibrate). Sits above bench; the runtime dispatcher (dispatch/) never imports it."""
