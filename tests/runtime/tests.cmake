# tests/runtime -- the tests of runtime/ (included by tests/CMakeLists.txt).
khor_test(test_config runtime/test_config.c 60)
target_compile_definitions(test_config PRIVATE KHOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
khor_test(test_comms runtime/test_comms.c 600)
khor_test(test_faults runtime/test_faults.c 300)
khor_test(test_elastic runtime/test_elastic.c 180)
# The two-threads-per-rank workload of test_comms without Criterion, for a
# -DKHOR_SANITIZE=thread build (Criterion's runner does not work under TSan); not a CTest
# test, test_comms runs the same workload.
add_executable(tsan_comms runtime/tsan_comms.c harness.c ${PROJECT_SOURCE_DIR}/bindings/capi.c
  ${PROJECT_SOURCE_DIR}/bindings/capi_engine.c)
target_link_libraries(tsan_comms PRIVATE khor_engine m)
