#!/bin/bash
# β against nearest neighbour at M = 100 (after run2.sh): where do the Hopfield models catch up?
cd /work/wt/baselines
source /work/venv/bin/activate
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 NPH_DATA=/work/shared/data
R=docs/results/baselines
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "$(date +%s.%N) $s rc=$rc :: $*" | awk '{printf "%.1f s  %s\n", $1-$2, substr($0, index($0,$3))}' >> $R/times.txt; }
t python -m nphcli sweep --preset baselines --dataset mnist --sizes 100 --beta 0.01,0.1,1,10 --trials 3 --threads 1 --out $R/mnist-mask-beta.jsonl --plot docs/img/baselines-mnist-mask-beta.png
t python -m nphcli store mnist --n 100 --normalize minmax --out /tmp/bl/mnist100.safetensors --force  # the default (then unit) when this ran
t python -m nphcli attractors --memory /tmp/bl/mnist100.safetensors --model dense --queries 50 --steps 20 --beta 0.01,0.05,0.1,0.5 --noise 0.3 --pictures docs/img/attractors-mnist-dense --json > $R/attractors-mnist-dense.json
echo done3 >> $R/times.txt
