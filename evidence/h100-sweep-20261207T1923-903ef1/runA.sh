# this session's first H200 call after the sweep: machine-2 of the H200 table (union-B), then the GEMV structures
# probe on the H200 (never run there); another GPU: the default union sweep, timed. usage: bash .device/runA.sh
set -u
T0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
if ! grep -q H200 $OUT/gpu.txt; then TMO=200 bash .device/run70d.sh; exit 0; fi
TTL=250 GPU=h200 WORD=H200 RUN=union-B bash .device/run_table.sh
LEFT=$(( ${PROBE_UNTIL:-0} - ($(date +%s) - T0) )); echo "left for the probe: $LEFT s"
[ $LEFT -gt 60 ] || exit 0
B=$(( LEFT - 40 )); [ $B -gt 150 ] && B=150
timeout $LEFT python -m tools.probes.gemv_variants --out /tmp/v --budget-s $B > /tmp/v.log 2>&1; echo "probe exit $?"
tail -5 /tmp/v.log; cp /tmp/v.log /tmp/v/ 2>/dev/null; tar cJf $OUT/v.tar.xz -C /tmp v
echo "done after $(( $(date +%s) - T0 )) s"
