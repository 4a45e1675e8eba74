"""A stand-in for bench.multi's GPU worker in CPU tests of the orchestration: it 'measures' a shape by copying that
shape's rows from a committed H200 run into its shard folder (rows unedited), with the shard's run.json."""
import json
import time
from contextlib import nullcontext
from pathlib import Path

DATA = Path(__file__).parent / "data"


def copy_rows_worker(device, job):
    import queue

    payload, grid, pinned, work, events, lock, out, devices = (job.payload, job.grid, job.pinned, job.work,
                                                                job.events, job.lock, job.out, job.devices)
    src = Path(payload["command"][-1])  # the test passes the source run as the command's last word
    lines = (src / "results.csv").read_text().splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    shape_of = [line.split(",", 1)[0] for line in body]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mine = list(pinned)
    taken = []
    while True:
        if mine:
            name = mine.pop(0)
        else:
            try:
                name = work.get_nowait()
            except queue.Empty:
                break
        with lock or nullcontext():  # the host-time lock (none when concurrent) around a piece of each shape
            time.sleep(0.01)
        taken.append(name)
        rows = [line for line, s in zip(body, shape_of) if s in taken]
        (out / "results.csv").write_text(header + "".join(rows))
        events.put(("done", device, name, 0.01))
    info = json.loads((src / "run.json").read_text())
    info["shard"] = {"device": device, "devices": devices, "grid_shapes": grid}
    info["host_timing"] = payload["host_timing"]  # as run_sweep writes it
    info["worker_had_lock"] = lock is not None  # for the test only
    (out / "run.json").write_text(json.dumps(info))
