#!/usr/bin/env bash
# The training example end to end at 2 ranks (CTest's example_train_cnn_n2): default epochs
# on scikit-learn's digits, at least 95 % test accuracy (the example exits 1 below it), and
# rank 0's checkpoint as the only file written in the working directory.
# Usage: run_example.sh KHORRUN PYTHON EXAMPLE
set -euo pipefail
khorrun=$1 python=$2 example=$3
if ! "$python" -c "import torch, sklearn" 2>/dev/null; then
  echo "run_example: skipped: $python lacks torch or sklearn (apt-get install python3-torch python3-sklearn)"
  exit 77
fi
dir=$(mktemp -d /tmp/khor-example-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$khorrun" -np 2 "$python" "$example" --expect-accuracy 95 --checkpoint checkpoint.pt
files=$(ls -A)
if [ "$files" != "checkpoint.pt" ]; then
  echo "run_example: expected only rank 0's checkpoint.pt in the working directory, found: $files" >&2
  exit 1
fi
"$python" -c "import torch; sd = torch.load('checkpoint.pt'); assert len(sd) > 0, 'empty checkpoint'"
echo "run_example: ok (checkpoint.pt written by rank 0 only)"
