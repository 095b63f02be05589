#!/bin/bash
# Measurements for docs/baselines.md; each command timed.
cd /work/wt/baselines
source /work/venv/bin/activate
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 NPH_DATA=/work/shared/data
R=docs/results/baselines
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "$(date +%s.%N) $s rc=$rc :: $*" | awk '{printf "%.1f s  %s\n", $1-$2, substr($0, index($0,$3))}' >> $R/times.txt; }
: > $R/times.txt
t python -m nphcli store random --distribution binary --dim 200 --n 2000 --normalize none --seed 0 --out /tmp/bl/pm1.safetensors --force
t python -m nphcli sweep --dataset /tmp/bl/pm1.safetensors --normalize none --sizes 10,16,20,24,28,32,36,40,50,60 --trials 5 --model hebbian,pseudoinverse --order async --steps 20 --noise 0 --flip 0,0.05 --threads 1 --out $R/capacity-pm1-d200.jsonl --plot docs/img/capacity-pm1-d200.png
t python -m nphcli sweep --preset baselines --dataset mnist --trials 5 --threads 1 --out $R/mnist-mask.jsonl --plot docs/img/baselines-mnist-mask.png
t python -m nphcli sweep --preset baselines --dataset mnist --sizes 100 --mask 0 --noise 0.3162,0.6325,1.0,1.1832 --trials 5 --threads 1 --out $R/mnist-noise.jsonl --plot docs/img/baselines-mnist-noise.png
t python -m nphcli sweep --preset baselines --dataset cifar10 --sizes 5,10,20 --trials 5 --threads 1 --out $R/cifar10-mask.jsonl --plot docs/img/baselines-cifar10-mask.png
t python -m nphcli sweep --preset baselines --dataset /tmp/bl/pm1.safetensors --normalize none --mask 0 --mask-mode random --flip 0.1,0.2 --sizes 10,20,40 --model nearest,dense,sparse,hebbian,pseudoinverse --metric euclidean --steps 20 --beta 0.1 --trials 5 --threads 1 --out $R/pm1-flip.jsonl --plot docs/img/baselines-pm1-flip.png
echo done >> $R/times.txt
