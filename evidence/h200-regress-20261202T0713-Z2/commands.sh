# lease Z2: the regression gate at HEAD (body of make regress), then every other gpu-marked test
nvidia-smi --query-gpu=uuid,name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
( time BENCH_REGRESSION_WORK=/tmp/rw timeout 300 python -m pytest -q -s -m gpu tests/test_gpu_regression.py -p no:cacheprovider ) > $OUT/regress.log 2>&1
tar cf $OUT/rw.tar -C /tmp rw 2>/dev/null; grep -v "it/s" $OUT/regress.log | tail -15
( time timeout 220 python -m pytest -q -m gpu tests/ --ignore tests/test_gpu_regression.py -p no:cacheprovider --durations 15 ) > $OUT/gputests.log 2>&1
tail -30 $OUT/gputests.log
