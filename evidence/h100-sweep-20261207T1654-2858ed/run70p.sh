# issue 70 on an H200: the union sweep under cProfile (where the harness's time goes), then the GEMV tuned afresh
# (PDL, few-row tiles) against the shipped configurations on the weak cells. usage: bash .device/run70p.sh
set -u
T0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then G=h200; else G=h100; fi
P=/tmp/p; mkdir -p $P
timeout 270 python -m cProfile -o $P/sweep.prof -m bench run --gpu $G --layout union --out /tmp/sweep > $P/sweep.log 2>&1
echo "sweep exit $? after $(( $(date +%s) - T0 )) s"; tail -3 $P/sweep.log
python -c "import json; i=json.load(open('/tmp/sweep/run.json')); print(i['wall_s'], i['phase_s'])" | tee $P/phases.txt
python - <<'PY' > $P/prof.txt
import pstats, os
s = pstats.Stats("/tmp/p/sweep.prof")
s.sort_stats("tottime").print_stats(45)
s.sort_stats("cumulative").print_stats(80)
PY
cp /tmp/sweep/run.json $P/; xz -c /tmp/sweep/results.csv > $P/results.csv.xz
LEFT=$(( 420 - ($(date +%s) - T0) )); echo "left for gemv_ab: $LEFT s"
timeout $LEFT python -m tools.probes.gemv_ab --configs dispatch/thresholds/$G.autotune.gemv.json --cells .device/limit_cells.txt --samples 10 --out $P/ab > $P/ab.log 2>&1; echo "ab exit $?"; tail -2 $P/ab.log
tar cJf $OUT/p.tar.xz -C /tmp p; tail -5 $P/ab.log
