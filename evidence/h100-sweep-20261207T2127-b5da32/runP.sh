# an H100 call (issue 70): the default union sweep on this fresh machine timed as a user runs it (run70d.sh; the
# compile-ahead's effect against h100-sweep-20261207T1923-903ef1), the compile-ahead, table-plain and tile GPU tests,
# then the probe of the swapped and pipelined GEMV products with the time left. usage: bash .device/runP.sh
set -u
T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi -L | tee $OUT/gpu.txt
TMO=200 bash .device/run70d.sh
echo "left: $(left) s"
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_gpu_gemv.py tests/test_gpu_forward.py -k "compiled_ahead or fused_siblings_run_fewer or matches_fp32 or refuses" > $OUT/pytest.log 2>&1; echo "pytest exit $?"; tail -12 $OUT/pytest.log
for pass in "2,8 tc16-s3,swap a" "1 rows,pipe,swap b"; do  # M = 2 and 8 first, then M = 1
  set -- $pass; B=$(( $(left) - 25 )); [ "$3" = a ] && B=$(( B * 6 / 10 ))
  [ $B -gt 40 ] || break
  timeout $B python -m tools.probes.gemv_variants --out /tmp/probe-$3 --cells 2560x4096,4096x2048 --ms $1 --families $2 --budget-s $(( B - 15 )) 2>&1 | grep -v "it/s" | tail -16
done
tar cJf $OUT/probe.tar.xz -C /tmp $(cd /tmp && ls -d probe-* 2>/dev/null)
echo "done after $(( $(date +%s) - T0 )) s"
