# lease Z3: the LM-head TinyGEMM cell at M=1 (the regression gate's one failure), new harness vs old, alternating
nvidia-smi --query-gpu=uuid,name,driver_version --format=csv > $OUT/gpu.txt
A="--gpu h200 --paths aten,flashinfer:tinygemm --shapes n248320_k2560,n248320_k2048 --m 1,4 --samples 10 --autotune-cache $PWD/tests/baselines/h200.autotune.json"
mkdir -p /tmp/lm
for i in 1 2 3; do
  ( timeout 70 python -m bench run $A --out /tmp/lm/new$i ) > /tmp/lm/new$i.log 2>&1
  ( cd .old && export PYTHONPATH=/tmp/site && timeout 70 python -m bench run $A --out /tmp/lm/old$i ) > /tmp/lm/old$i.log 2>&1
  tar cf $OUT/lm.tar -C /tmp lm
done
python - <<'PY'
import pandas as pd, glob
for f in sorted(glob.glob("/tmp/lm/*/results.csv")):
    d = pd.read_csv(f); p = d.pivot_table(index=["shape","m"], columns="path", values="gpu_us")
    p["ratio"] = p["flashinfer:tinygemm"] / p["aten"]; print(f.split("/")[3], p.round(3).to_string().replace("\n", " | "))
PY
