# tests/tensorflow_keras -- the tests of khor.tensorflow.keras / khor.keras and of the
# examples in examples/tensorflow (included by tests/CMakeLists.txt), with the Python that
# libkhor_tf.so was built for (KHOR_TF_PYTHON):
#   tfkeras_pytest_n2          the pytest session at 2 ranks, Keras 3
#   tfkeras_legacy_pytest_n2   the same with TF_USE_LEGACY_KERAS=1 (tf-keras), where
#                              tf-keras is installed (the tests of the other one skip)
#   tfkeras_example_<name>     examples/tensorflow/<name>.py at np 1, 2 and 4: test accuracy
#                              >= 95 % on scikit-learn's digits, within 1 point across np,
#                              checkpoints from rank 0 only (run_examples.py)
# About 2.5 minutes together on 2 cores. Without libkhor_tf.so (no TensorFlow, a sanitizer
# build, KHOR_TF_PYTHON=OFF) or pytest each skips with one line saying why.
set(khor_tfk_why "")
if(NOT (KHOR_TF_PYTHON AND KHOR_TF_BUILT AND TARGET khor_tf))
  set(khor_tfk_why "libkhor_tf.so is not built (${KHOR_TF_STATUS})")
else()
  execute_process(COMMAND ${KHOR_TF_PYTHON} -c "import pytest, cloudpickle, sklearn"
    RESULT_VARIABLE khor_tfk_deps OUTPUT_QUIET ERROR_QUIET)
  if(NOT khor_tfk_deps EQUAL 0)
    set(khor_tfk_why "${KHOR_TF_PYTHON} lacks pytest, cloudpickle or scikit-learn")
  endif()
endif()

set(khor_tfk_tests tfkeras_pytest_n2 tfkeras_legacy_pytest_n2 tfkeras_example_keras_mnist
    tfkeras_example_gradient_tape)
if(khor_tfk_why)
  foreach(t ${khor_tfk_tests})
    add_test(NAME ${t} COMMAND sh -c "echo '${t} skipped: ${khor_tfk_why}'; exit 77")
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
else()
  set(khor_tfk_env
    "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python:${PROJECT_SOURCE_DIR}/bindings/python/horovod_compat"
    "KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>" "KHOR_TF_LIBRARY_PATH=$<TARGET_FILE:khor_tf>"
    "PYTHONDONTWRITEBYTECODE=1" "TF_CPP_MIN_LOG_LEVEL=3")
  add_test(NAME tfkeras_pytest_n2 COMMAND $<TARGET_FILE:khorrun> -np 2 ${KHOR_TF_PYTHON}
    -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(tfkeras_pytest_n2 PROPERTIES TIMEOUT 300
    ENVIRONMENT "${khor_tfk_env};TF_USE_LEGACY_KERAS=0")
  execute_process(COMMAND ${KHOR_TF_PYTHON} -c "import tf_keras"
    RESULT_VARIABLE khor_tfk_legacy OUTPUT_QUIET ERROR_QUIET)
  if(khor_tfk_legacy EQUAL 0)
    add_test(NAME tfkeras_legacy_pytest_n2 COMMAND $<TARGET_FILE:khorrun> -np 2
      ${KHOR_TF_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(tfkeras_legacy_pytest_n2 PROPERTIES TIMEOUT 300
      ENVIRONMENT "${khor_tfk_env};TF_USE_LEGACY_KERAS=1")
  else()
    add_test(NAME tfkeras_legacy_pytest_n2 COMMAND sh -c
      "echo 'tfkeras_legacy_pytest_n2 skipped: ${KHOR_TF_PYTHON} has no tf_keras (pip install tf-keras)'; exit 77")
    set_tests_properties(tfkeras_legacy_pytest_n2 PROPERTIES SKIP_RETURN_CODE 77)
  endif()
  foreach(ex keras_mnist gradient_tape)
    add_test(NAME tfkeras_example_${ex} COMMAND ${KHOR_TF_PYTHON}
      ${CMAKE_CURRENT_LIST_DIR}/run_examples.py $<TARGET_FILE:khorrun> ${KHOR_TF_PYTHON}
      ${PROJECT_SOURCE_DIR}/examples/tensorflow/${ex}.py --np 1,2,4 --expect 95 --spread 1)
    set_tests_properties(tfkeras_example_${ex} PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77
      ENVIRONMENT "${khor_tfk_env};TF_USE_LEGACY_KERAS=0")
  endforeach()
endif()
