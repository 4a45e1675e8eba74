# a short call (issue 70): the default union sweep on empty compile caches (on an H200 the 90 s target), then on an
# H200 the table's next leg (union-B), on an H100 the same sweep with --no-compile-ahead (the A/B), with the time
# left. usage: LIMIT=S bash .device/runS.sh
set -u
T0=$(date +%s)
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - T0) )); }
nvidia-smi -L | tee $OUT/gpu.txt
FRESH=1 TMO=180 bash .device/run70d.sh
echo "left: $(left) s"
if grep -q H200 $OUT/gpu.txt; then
  [ $(left) -gt 110 ] && TTL=$(( $(left) - 10 )) GPU=h200 WORD=H200 RUN=union-B bash .device/run_table.sh
else
  [ $(left) -gt 140 ] && TAG=d-off EXTRA=--no-compile-ahead FRESH=1 TMO=$(( $(left) - 10 )) bash .device/run70d.sh
fi
echo "done after $(( $(date +%s) - T0 )) s"
