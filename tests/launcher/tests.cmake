# tests/launcher -- the tests of launcher/ (included by tests/CMakeLists.txt).
khor_test(test_khorrun launcher/test_khorrun.c 120)
target_link_libraries(test_khorrun PRIVATE khor_testproc)
add_dependencies(test_khorrun khorrun khor-bench)
set_tests_properties(test_khorrun PROPERTIES ENVIRONMENT
  "KHORRUN=$<TARGET_FILE:khorrun>;KHOR_BENCH=$<TARGET_FILE:khor-bench>")
# The job secret in none of a job's output, logs, timelines, error texts and core dumps
# (those of Python ranks too, where Python is and the build is not a sanitizer's).
if(KHOR_PYTHON AND NOT KHOR_SANITIZE)
  add_test(NAME test_secret COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_secret.sh
    $<TARGET_FILE:khorrun> $<TARGET_FILE:khor-bench> ${KHOR_PYTHON})
  set_tests_properties(test_secret PROPERTIES TIMEOUT 180 ENVIRONMENT
    "PYTHONPATH=${PROJECT_SOURCE_DIR}/bindings/python;KHOR_LIBRARY_PATH=$<TARGET_FILE:khor>;PYTHONDONTWRITEBYTECODE=1")
else()
  add_test(NAME test_secret COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_secret.sh
    $<TARGET_FILE:khorrun> $<TARGET_FILE:khor-bench>)
  set_tests_properties(test_secret PROPERTIES TIMEOUT 180)
endif()
# khorrun -H over ssh on 4 network-namespace hosts, each with its own sshd (exit 77, a skip,
# without root, sshd or network namespaces).
add_test(NAME hosts_ssh COMMAND ${CMAKE_CURRENT_LIST_DIR}/../hosts/test_hosts.sh
  $<TARGET_FILE:khorrun> $<TARGET_FILE:khor-bench> $<TARGET_FILE:example-allreduce>
  $<TARGET_FILE:elastic_worker>)
set_tests_properties(hosts_ssh PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS hosts
  RUN_SERIAL TRUE)
# A real one-node Slurm (slurmctld, slurmd, munged on 127.0.0.1, all under a temp dir):
# srun and sbatch start khor jobs with no khorrun (exit 77, a skip, without root or Slurm).
add_test(NAME test_slurm COMMAND ${CMAKE_CURRENT_LIST_DIR}/../slurm/test_slurm.sh
  $<TARGET_FILE:khor-bench> $<TARGET_FILE:example-allreduce> $<TARGET_FILE:khorrun>)
set_tests_properties(test_slurm PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS slurm)
