# Where the patched 4B's eager prefill loses time: stock, patched with the table, patched with the table's eager
# ranges removed (bound layers, F.linear eagerly); interleaved shuffled rounds; plus per-linear host cost per call.
import copy, gc, json, random, sys, time
from pathlib import Path
import torch
sys.path.insert(0, ".")
import dispatch
from bench.e2e import build_model
from bench.forward import models_for
from dispatch.table import load_table, parse_table

TABLE = "evidence/h200-tf-table-20261201T1624-E/table.json"
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
hf = next(iter(models_for(["Qwen3.5-4B"], None).values()))
model = build_model(hf, None, "cuda")
table = load_table(path=TABLE)
data = json.loads(Path(TABLE).read_text())
no_eager = copy.deepcopy(data)
for s in no_eager["shapes"]:
    s["eager"] = []
no_eager["default"]["eager"] = []
no_eager_t = parse_table(no_eager, "no-eager")
import dataclasses
no_eager_t = dataclasses.replace(no_eager_t, tactics=table.tactics)
tables = {"patched": table, "patched-no-eager": no_eager_t}
gen = torch.Generator().manual_seed(0)
prompts = {n: torch.randint(0, 248000, (1, n), generator=gen).cuda() for n in (8, 128, 1031)}
res = {}

def timed(fn):
    torch.cuda.synchronize(); t0 = time.perf_counter_ns(); fn(); torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / 1e3

rng = random.Random(0)
variants = ["stock", "patched", "patched-no-eager"]
with torch.no_grad():
    for r in range(12):
        for v in rng.sample(variants, len(variants)):
            h = None
            if v != "stock":
                dispatch.configure(tables[v]); h = dispatch.patch(model)
            for n, ids in prompts.items():
                model(ids)
                for gcmode in ("on", "off"):
                    if gcmode == "off":
                        gc.collect(); gc.disable()
                    res.setdefault(f"{v} {n} gc-{gcmode}", []).append(timed(lambda: model(ids)))
                    gc.enable()
            if h is not None:
                h.remove()
        print("round", r, flush=True)

# host per call of each distinct linear shape, stock module call vs patched module call, at M = 8, 128, 1031
lin = {}
for name, m in model.named_modules():
    if type(m) is torch.nn.Linear and m.bias is None and "lm_head" not in name:
        lin.setdefault(tuple(m.weight.shape), (name, m))
host = {}
with torch.no_grad():
    for v in variants:
        h = None
        if v != "stock":
            dispatch.configure(tables[v]); h = dispatch.patch(model)
        for shape, (name, m) in lin.items():
            for M in (8, 128, 1031):
                x = torch.randn(1, M, shape[1], device="cuda", dtype=torch.bfloat16)
                for _ in range(20):
                    m(x)
                torch.cuda.synchronize()
                best = []
                for rep in range(5):
                    gc.disable(); t0 = time.perf_counter_ns()
                    for _ in range(200):
                        m(x)
                    t1 = time.perf_counter_ns(); gc.enable()
                    torch.cuda.synchronize()
                    best.append((t1 - t0) / 200 / 1e3)
                host[f"{v} {shape[0]}x{shape[1]} M={M}"] = sorted(best)[2]
        if h is not None:
            h.remove()
(out / "diag.json").write_text(json.dumps({"prefill": res, "host_per_call_us": host}, indent=1))
import statistics as st
for k, v in res.items():
    print(f"{k:32s} median {st.median(v):10.0f}  min {min(v):10.0f}  n {len(v)}")
for k, v in host.items():
    print(f"{k:40s} {v:7.2f} us/call")
print("layer kind", dispatch.layer_kind(dispatch.bind(next(iter(lin.values()))[1].weight)))
