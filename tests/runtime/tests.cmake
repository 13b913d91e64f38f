# tests/runtime -- the tests of runtime/ (included by tests/CMakeLists.txt).
khor_test(test_config runtime/test_config.c 60)
target_compile_definitions(test_config PRIVATE KHOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
khor_test(test_comms runtime/test_comms.c 600)
khor_test(test_faults runtime/test_faults.c 300)
# Injected faults (KHOR_FAULTS) under every collective, n = 2, 4, 8, tcp and shm.
khor_test(test_fault_matrix runtime/test_fault_matrix.c 1800)
if(KHOR_SANITIZE)
  # Under the sanitizers, n = 2: the error paths are the same code at every n, at a third
  # of the time (the plain build runs n = 2, 4 and 8).
  set_tests_properties(test_fault_matrix PROPERTIES ENVIRONMENT KHOR_TEST_FAULT_NS=2)
endif()
khor_test(test_limits runtime/test_limits.c 120)
khor_test(test_elastic runtime/test_elastic.c 180)
# The two-threads-per-rank workload of test_comms without Criterion, for a
# -DKHOR_SANITIZE=thread build (Criterion's runner does not work under TSan); not a CTest
# test, test_comms runs the same workload.
add_executable(tsan_comms runtime/tsan_comms.c harness.c ${PROJECT_SOURCE_DIR}/bindings/capi.c
  ${PROJECT_SOURCE_DIR}/bindings/capi_engine.c)
target_link_libraries(tsan_comms PRIVATE khor_engine m)
# Liveness, not a deadline: a slow rank is waited for, a stopped one is named (and killed by
# khorrun). Real jobs of the test binary's own ranks, KHOR_TIMEOUT 1 s.
khor_test(test_liveness runtime/test_liveness.c 120)
add_dependencies(test_liveness khorrun)
set_tests_properties(test_liveness PROPERTIES ENVIRONMENT "KHORRUN=$<TARGET_FILE:khorrun>")
# Real MPI launchers start khor jobs (khor links no MPI): OpenMPI's mpirun and MPICH's Hydra
# (.ci/packages --mpi) at np 2 and 4, the refusal without MASTER_ADDR, and a Python rank
# (exit 77, a skip, when neither launcher is installed). No Python case in a sanitizer
# build, whose libkhor.so a plain python3 cannot load.
set(khor_mpirun_python "")
if(KHOR_PYTHON AND NOT KHOR_SANITIZE)
  set(khor_mpirun_python ${KHOR_PYTHON})
endif()
add_test(NAME test_mpirun COMMAND ${PROJECT_SOURCE_DIR}/tests/mpi/test_mpirun.sh
  $<TARGET_FILE:example-allreduce> $<TARGET_FILE:khor> ${PROJECT_SOURCE_DIR}
  ${khor_mpirun_python})
set_tests_properties(test_mpirun PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77 LABELS mpi)
