#!/bin/bash
# The ±1 grid of run.sh again, with --mask-mode random (run.sh's first try lacked it and was refused).
cd /work/wt/baselines
source /work/venv/bin/activate
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
R=docs/results/baselines
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "$(date +%s.%N) $s rc=$rc :: $*" | awk '{printf "%.1f s  %s\n", $1-$2, substr($0, index($0,$3))}' >> $R/times.txt; }
t python -m nphcli sweep --preset baselines --dataset /tmp/bl/pm1.safetensors --normalize none --mask 0 --mask-mode random --flip 0.1,0.2 --sizes 10,20,40 --model nearest,dense,sparse,hebbian,pseudoinverse --metric euclidean --steps 20 --beta 0.1 --trials 5 --threads 1 --out $R/pm1-flip.jsonl --plot docs/img/baselines-pm1-flip.png
echo done4 >> $R/times.txt
# The success plots of docs/baselines.md, from the results files above:
#   nph plot $R/mnist-mask.jsonl --metric success --x size --out docs/img/baselines-mnist-mask-success.png
#   nph plot $R/mnist-noise.jsonl --metric success --x noise --out docs/img/baselines-mnist-noise-success.png
#   nph plot $R/mnist-mask-beta.jsonl --metric success --x beta --out docs/img/baselines-mnist-mask-beta-success.png
#   nph plot $R/cifar10-mask.jsonl --metric success --x size --out docs/img/baselines-cifar10-mask-success.png
#   nph plot $R/capacity-pm1-d200.jsonl --metric mse --x size --where flip=0 --out docs/img/capacity-pm1-d200-mse.png
#   nph plot $R/capacity-pm1-d500.jsonl --metric mse --x size --out docs/img/capacity-pm1-d500-mse.png
#   nph plot $R/pm1-flip.jsonl --metric success --x size --facet flip --out docs/img/baselines-pm1-flip-success.png
