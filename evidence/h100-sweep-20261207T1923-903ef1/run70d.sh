# issue 70: the default union sweep as a user runs it (no profiler), its process and in-run time; then, on an H200,
# the first legs of the H200 table if time is left. usage: bash .device/run70d.sh
set -u
T0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then G=h200; else G=h100; fi
P=/tmp/d; mkdir -p $P
S=$(date +%s.%N)
timeout ${TMO:-230} python -m bench run --gpu $G --layout union ${EXTRA:-} --out /tmp/sweep > $P/sweep.log 2>&1; echo "sweep exit $?"
E=$(date +%s.%N); python -c "print('process_s', round($E - $S, 1))" | tee $P/process.txt
grep -v "it/s\|s/it" $P/sweep.log | tail -8
python -c "import json; i=json.load(open('/tmp/sweep/run.json')); print(i['wall_s'], i['phase_s'], i.get('kernel_records'), i.get('gemv_configs'))" | tee $P/phases.txt
cp /tmp/sweep/run.json $P/; xz -c /tmp/sweep/results.csv > $P/results.csv.xz
python -m calibrate validate /tmp/sweep > $P/validate.log 2>&1; echo "validate exit $?"; tail -4 $P/validate.log
tar cJf $OUT/d.tar.xz -C /tmp d
echo "done after $(( $(date +%s) - T0 )) s"
