#!/bin/bash
# The Hebbian capacity at d = 500 (after run.sh), to see the transition sharpen with d.
cd /work/wt/baselines
source /work/venv/bin/activate
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
R=docs/results/baselines
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "$(date +%s.%N) $s rc=$rc :: $*" | awk '{printf "%.1f s  %s\n", $1-$2, substr($0, index($0,$3))}' >> $R/times.txt; }
t python -m nphcli store random --distribution binary --dim 500 --n 1000 --normalize none --seed 1 --out /tmp/bl/pm1-500.safetensors --force
t python -m nphcli sweep --dataset /tmp/bl/pm1-500.safetensors --normalize none --sizes 40,50,60,70,80,90,100,120 --trials 3 --model hebbian --order sync --steps 30 --noise 0 --threads 1 --out $R/capacity-pm1-d500.jsonl --plot docs/img/capacity-pm1-d500.png
echo done2 >> $R/times.txt
