# tests/python -- the tests of python/ (included by tests/CMakeLists.txt).
# The Python package under khorrun, at 2 and 4 ranks: every rank runs the same pytest session.
# Needs Debian's python3-pytest (python3-torch and python3-numpy for most tests; the tests
# that need torch skip with the reason when it is missing).
# Not in sanitizer builds: python3 would load an instrumented libkhor without the sanitizer's
# runtime first (ASan refuses to start); the C tests cover that code under the sanitizers.
if(KHOR_PYTHON AND NOT KHOR_SANITIZE)
  execute_process(COMMAND ${KHOR_PYTHON} -c "import pytest" RESULT_VARIABLE KHOR_HAVE_PYTEST
    OUTPUT_QUIET ERROR_QUIET)
  if(KHOR_HAVE_PYTEST EQUAL 0)
    # test_fast.py asserts that the hot path's extension (bindings/python/ext) loaded where
    # the build made it; pytest_n2_ctypes runs the allreduce and optimizer tests without it.
    if(TARGET khorfast)
      set(khor_expect_fast 1)
    else()
      set(khor_expect_fast 0)
    endif()
    foreach(n 2 4)
      add_test(NAME pytest_n${n} COMMAND $<TARGET_FILE:khorrun> -np ${n} ${KHOR_PYTHON} -m pytest
        -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/../python)
      set_tests_properties(pytest_n${n} PROPERTIES TIMEOUT 900 ENVIRONMENT
        "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python;KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;PYTHONDONTWRITEBYTECODE=1;KHOR_EXPECT_FAST=${khor_expect_fast}")
    endforeach()
    add_test(NAME pytest_n2_ctypes COMMAND $<TARGET_FILE:khorrun> -np 2 ${KHOR_PYTHON} -m pytest
      -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_fast.py
      ${CMAKE_CURRENT_LIST_DIR}/test_torch_allreduce.py ${CMAKE_CURRENT_LIST_DIR}/test_torch_optimizer.py)
    set_tests_properties(pytest_n2_ctypes PROPERTIES TIMEOUT 300 ENVIRONMENT
      "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python;KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;PYTHONDONTWRITEBYTECODE=1;KHOR_FAST=0")
    # The fault matrix of tests/runtime/test_fault_matrix.c through khor.torch and its engine
    # (test_fault_matrix.py): plain pytest, not under khorrun; it launches the jobs itself
    # (one per n, every case of tcp and shm in it, and two cases as jobs of their own), and
    # skips with the reason without torch. --noconftest: conftest.py is the ranks' (it joins
    # a job for every test); here pytest is no rank.
    add_test(NAME pytest_fault_matrix COMMAND ${KHOR_PYTHON} -m pytest -v -s -p no:cacheprovider
      --noconftest ${CMAKE_CURRENT_LIST_DIR}/test_fault_matrix.py)
    set_tests_properties(pytest_fault_matrix PROPERTIES TIMEOUT 1200 ENVIRONMENT
      "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python;KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;KHORRUN=$<TARGET_FILE:khorrun>;PYTHONDONTWRITEBYTECODE=1;KHOR_FAULT_MATRIX_NS=2,4")
    add_test(NAME example_train_cnn_n2 COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_example.sh
      $<TARGET_FILE:khorrun> ${KHOR_PYTHON} ${PROJECT_SOURCE_DIR}/examples/python/train_cnn.py)
    set_tests_properties(example_train_cnn_n2 PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 ENVIRONMENT
      "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python;KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;PYTHONDONTWRITEBYTECODE=1")
    # Elastic runs end to end: khorrun's elastic driver, a worker killed, hosts added and
    # removed (tests/python/elastic/run_elastic.py). The horovod_* ones run Horovod's own
    # test/integration/data/elastic_torch_main.py unchanged through the horovod alias:
    # -DKHOR_HOROVOD_SRC=<a Horovod checkout> (or the variable in the environment), else they
    # skip.
    set(KHOR_HOROVOD_SRC "$ENV{KHOR_HOROVOD_SRC}" CACHE PATH
      "A Horovod source tree, for the elastic_horovod_* tests (optional)")
    foreach(s kill hosts horovod-hosts horovod-failure-exception horovod-failure-kill
              horovod-fixed-hosts-kill horovod-reset-limit)
      string(REPLACE "-" "_" t "elastic_${s}")
      add_test(NAME ${t} COMMAND ${KHOR_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/elastic/run_elastic.py
        $<TARGET_FILE:khorrun> ${KHOR_PYTHON} ${s})
      set_tests_properties(${t} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT
        "KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;KHOR_HOROVOD_SRC=${KHOR_HOROVOD_SRC}")
    endforeach()
    add_dependencies(khor_testlib khorrun)
  else()
    message(STATUS "pytest not found for ${KHOR_PYTHON}: the Python tests are not run (apt-get install python3-pytest)")
  endif()
endif()
