# issue 70: the default union sweep as a user runs it (no profiler), its process and in-run time; then, on an H200,
# the first legs of the H200 table if time is left. usage: bash .device/run70d.sh
set -u
T0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then G=h200; else G=h100; fi
TAG=${TAG:-d}; P=/tmp/$TAG; W=/tmp/sweep-$TAG; mkdir -p $P  # TAG: another run's folder and tarball
# FRESH=1: empty Triton and C++-layer caches, as on a fresh machine (after other legs ran here)
[ "${FRESH:-0}" = 1 ] && export TRITON_CACHE_DIR=/tmp/fresh-triton BLB_NATIVE_DIR=/tmp/fresh-native && rm -rf /tmp/fresh-triton /tmp/fresh-native
S=$(date +%s.%N)
timeout ${TMO:-230} python -m bench run --gpu $G --layout union ${EXTRA:-} --out $W > $P/sweep.log 2>&1; echo "sweep exit $?"
E=$(date +%s.%N); python -c "print('process_s', round($E - $S, 1))" | tee $P/process.txt
grep -v "it/s\|s/it" $P/sweep.log | tail -8
python -c "import json; i=json.load(open('$W/run.json')); print(i['wall_s'], i['phase_s'], i.get('kernel_records'), i.get('gemv_configs'), i.get('compiled_ahead'))" | tee $P/phases.txt
cp $W/run.json $P/; xz -c $W/results.csv > $P/results.csv.xz
python -m calibrate validate $W > $P/validate.log 2>&1; echo "validate exit $?"; tail -4 $P/validate.log
tar cJf $OUT/$TAG.tar.xz -C /tmp $TAG
echo "done after $(( $(date +%s) - T0 )) s"
