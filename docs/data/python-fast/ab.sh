#!/bin/bash
# The Horovod-API step (bench/hvd_api_step.py), interleaved round by round: the Python package
# of 4d815ea (OLDPY), this one over ctypes (KHOR_FAST=0), this one with _khorfast, and real
# Horovod 0.28.1 in /tmp/hvd-venv; n = 2 and 4; R rounds. Run from the repository root after
# the build (build/). JSON per run in OUT; PERFORMANCE 24 has the medians.
R=${1:-3}; OLDPY=${OLDPY:?the old package: git archive 4d815ea bindings/python | tar -x -C DIR}; out=${OUT:-/tmp/ab}; mkdir -p $out
for r in $(seq 1 $R); do
 for n in 2 4; do
  for v in old ctypes fast horovod; do
   j=$out/$v-n$n-r$r.json
   case $v in
    old) PYTHONPATH=$OLDPY/bindings/python:$OLDPY/bindings/python/horovod_compat KHOR_LIBRARY_PATH=build/libkhor.so KHOR_FAST=0 timeout 600 build/khorrun -np $n /usr/bin/python3 bench/hvd_api_step.py --sets small,grouped,resnet50,lone --json $j ;;
    ctypes) PYTHONPATH=bindings/python:bindings/python/horovod_compat KHOR_LIBRARY_PATH=build/libkhor.so KHOR_FAST=0 timeout 600 build/khorrun -np $n /usr/bin/python3 bench/hvd_api_step.py --sets small,grouped,resnet50,lone --json $j ;;
    fast) PYTHONPATH=bindings/python:bindings/python/horovod_compat KHOR_LIBRARY_PATH=build/libkhor.so timeout 600 build/khorrun -np $n /usr/bin/python3 bench/hvd_api_step.py --sets small,grouped,resnet50,lone --json $j ;;
    horovod) timeout 600 /tmp/hvd-venv/bin/horovodrun --gloo -np $n -H localhost:$n /tmp/hvd-venv/bin/python bench/hvd_api_step.py --sets small,grouped,resnet50,lone --json $j ;;
   esac 2>&1 | grep -E "per tensor|rror" | sed "s/^/$v r$r: /"
  done
 done
done
