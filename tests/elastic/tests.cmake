# tests/elastic -- khorrun's elastic driver (included by tests/CMakeLists.txt).
# The planning rules alone, on launcher/elastic_plan.c's pure functions.
add_executable(test_elastic_plan elastic/test_elastic_plan.c
  ${PROJECT_SOURCE_DIR}/launcher/elastic_plan.c)
target_link_libraries(test_elastic_plan PRIVATE ${CRITERION_LINK_LIBRARIES})
target_include_directories(test_elastic_plan PRIVATE ${PROJECT_SOURCE_DIR}
  ${CRITERION_INCLUDE_DIRS})
add_test(NAME test_elastic_plan COMMAND test_elastic_plan --jobs 1)
set_tests_properties(test_elastic_plan PROPERTIES TIMEOUT 30)
# A real elastic worker on the public C API only, for the driver's cases.
add_executable(elastic_worker elastic/elastic_worker.c)
target_link_libraries(elastic_worker PRIVATE khor)
# The driver with those workers: losses, fencing, discovery, limits, a host over ssh.
khor_test(test_elastic_driver elastic/test_elastic_driver.c 120)
target_link_libraries(test_elastic_driver PRIVATE khor_testproc)
add_dependencies(test_elastic_driver khorrun elastic_worker)
set_tests_properties(test_elastic_driver PROPERTIES ENVIRONMENT
  "KHORRUN=$<TARGET_FILE:khorrun>;ELASTIC_WORKER=$<TARGET_FILE:elastic_worker>")
# An elastic job over etcd: one khorrun agent per host (here two on this machine), a real
# etcd server each case starts; the leader killed, etcd restarted, a failed worker.
khor_test(test_elastic_etcd elastic/test_elastic_etcd.c 120)
target_link_libraries(test_elastic_etcd PRIVATE khor_testproc)
add_dependencies(test_elastic_etcd khorrun elastic_worker)
set_tests_properties(test_elastic_etcd PROPERTIES ENVIRONMENT
  "KHORRUN=$<TARGET_FILE:khorrun>;ELASTIC_WORKER=$<TARGET_FILE:elastic_worker>")
# The fault matrix on this machine: tests/elastic/train_matrix.py (numpy, no framework)
# under the driver, one self-injected fault or more per case (tests/elastic/matrix.py).
# Not in sanitizer builds, as tests/python's: python3 cannot load an instrumented libkhor.
if(KHOR_PYTHON AND NOT KHOR_SANITIZE)
  foreach(c none kill_worker kill_rank0 exit_worker stop_worker kill_in_sync kill_twice
            reset_limit all_fail host_blacklisted every_host_blacklisted min_np_never
            state_lost)
    add_test(NAME elastic_matrix_${c} COMMAND ${KHOR_PYTHON}
      ${CMAKE_CURRENT_LIST_DIR}/matrix.py $<TARGET_FILE:khorrun> ${KHOR_PYTHON} ${c})
    set_tests_properties(elastic_matrix_${c} PROPERTIES TIMEOUT 240
      ENVIRONMENT "KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>")
  endforeach()
  # The matrix across 4 network-namespace hosts over real ssh, every case in one set of
  # hosts, faults injected from outside (tests/elastic/matrix_hosts.sh; exit 77, a skip,
  # without root, sshd or network namespaces).
  add_test(NAME elastic_matrix_hosts COMMAND ${CMAKE_CURRENT_LIST_DIR}/matrix_hosts.sh
    $<TARGET_FILE:khorrun> ${KHOR_PYTHON})
  set_tests_properties(elastic_matrix_hosts PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
    LABELS hosts RUN_SERIAL TRUE ENVIRONMENT "KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>")
endif()
