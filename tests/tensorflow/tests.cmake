# tests/tensorflow -- the tests of khor.tensorflow and libkhor_tf.so (included by
# tests/CMakeLists.txt). One pytest session per rank under khorrun, at 2 and 4 ranks, with
# the Python that libkhor_tf.so was built for (KHOR_TF_PYTHON). Without that library (no
# TensorFlow, a sanitizer build, KHOR_TF_PYTHON=OFF) the two tests skip with one line saying
# why.
if(KHOR_TF_BUILT)
  execute_process(COMMAND ${KHOR_TF_PYTHON} -c "import pytest, cloudpickle"
    RESULT_VARIABLE khor_tf_pytest OUTPUT_QUIET ERROR_QUIET)
endif()
foreach(n 2 4)
  if(KHOR_TF_BUILT AND khor_tf_pytest EQUAL 0)
    add_test(NAME tf_pytest_n${n} COMMAND $<TARGET_FILE:khorrun> -np ${n} ${KHOR_TF_PYTHON}
      -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(tf_pytest_n${n} PROPERTIES TIMEOUT 300 ENVIRONMENT
      "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python;KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;KHOR_TF_LIBRARY_PATH=$<TARGET_FILE:khor_tf>;PYTHONDONTWRITEBYTECODE=1;TF_CPP_MIN_LOG_LEVEL=3")
  else()
    if(KHOR_TF_BUILT)
      set(why "${KHOR_TF_PYTHON} has no pytest or cloudpickle")
    else()
      set(why "libkhor_tf.so is ${KHOR_TF_STATUS}")
    endif()
    add_test(NAME tf_pytest_n${n} COMMAND sh -c "echo 'tf_pytest_n${n} skipped: ${why}'; exit 77")
    set_tests_properties(tf_pytest_n${n} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()
