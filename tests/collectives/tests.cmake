# tests/collectives -- the tests of collectives/ (included by tests/CMakeLists.txt).
khor_test(test_allreduce collectives/test_allreduce.c 600)
khor_test(test_collectives collectives/test_collectives.c 900)
# Reduction kernels: every dtype x op against a double-precision reference.
khor_test(test_reduce collectives/test_reduce.c 120)
khor_test(test_hier collectives/test_hier.c 600)
khor_test(test_mem collectives/test_mem.c 300)
target_link_libraries(test_mem PRIVATE khor_mem_emu)
khor_test(test_device collectives/test_device.c 600)
target_link_libraries(test_device PRIVATE khor_mem_emu)
# Under the sanitizers, the jobs of up to 2 ranks (4 minutes under ASan with all of them).
if(KHOR_SANITIZE)
  set_tests_properties(test_device PROPERTIES ENVIRONMENT KHOR_TEST_DEVICE_MAX_N=2)
endif()
# The same on a real GPU (KHOR_TEST_DEVICE=cuda; label gpu: skips with the reason where no
# GPU is usable).
if(KHOR_HAVE_CUDA_KERNELS)
  target_link_libraries(test_device PRIVATE khor_cuda)
  add_test(NAME test_device_gpu COMMAND test_device --jobs 1)
  set_tests_properties(test_device_gpu PROPERTIES ENVIRONMENT KHOR_TEST_DEVICE=cuda
    LABELS gpu TIMEOUT 900)
endif()
# test_mem without Criterion, for a -DKHOR_SANITIZE=thread build (Criterion's runner does not
# start under TSan); not a CTest test: run build/tests/tsan_mem [name filter].
add_executable(tsan_mem collectives/test_mem.c)
target_compile_definitions(tsan_mem PRIVATE TEST_MEM_PLAIN)
target_link_libraries(tsan_mem PRIVATE khor_mem_emu khor_collectives m)
