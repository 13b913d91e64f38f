#!/usr/bin/env bash
# Builds libkhor_tf.so (khor's TensorFlow ops) by hand, until CMake does (issue 28):
#   bindings/tensorflow/build.sh <python with tensorflow> <libkhor's build dir> [out dir]
# It compiles against the headers that the tensorflow wheel ships and links
# libtensorflow_framework.so.2 (the C API's home) and libkhor.
set -euo pipefail
py=$1 build=$2 out=${3:-$2}
here=$(cd "$(dirname "$0")" && pwd)
tf=$("$py" -c 'import os, tensorflow as tf; print(os.path.dirname(tf.__file__))')
gcc -O2 -fPIC -Wall -Wextra -Werror -std=gnu11 -I"$tf/include" -I"$here/../../include" \
  -c "$here/khor_tf_ops.c" -o "$out/khor_tf_ops.o"
g++ -O2 -fPIC -Wall -Wextra -Werror -c "$here/done_shim.cc" -o "$out/khor_tf_done_shim.o"
g++ -shared -o "$out/libkhor_tf.so" "$out/khor_tf_ops.o" "$out/khor_tf_done_shim.o" \
  -L"$tf" -l:libtensorflow_framework.so.2 -Wl,-rpath,"$tf" -L"$build" -lkhor -Wl,-rpath,"$build"
echo "built $out/libkhor_tf.so against tensorflow in $tf"
