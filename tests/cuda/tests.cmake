# tests/cuda -- the tests of cuda/ (included by tests/CMakeLists.txt).
# The CUDA reduction kernels against the CPU's, bit for bit (label gpu: they skip with the
# reason where no GPU is usable; bench/gpu/device_check.sh runs them on the device machine).
if(KHOR_HAVE_CUDA_KERNELS)
  khor_test(test_cuda_reduce cuda/test_cuda_reduce.c 600)
  target_link_libraries(test_cuda_reduce PRIVATE khor_cuda)
  set_tests_properties(test_cuda_reduce PROPERTIES LABELS gpu)
  add_executable(cuda_reduce_bench cuda/cuda_reduce_bench.c)
  target_link_libraries(cuda_reduce_bench PRIVATE khor_cuda)
  # The cuda backend of the memory seam (cuda/mem_cuda.c) against mem.h's contract.
  khor_test(test_cuda_mem cuda/test_cuda_mem.c 600)
  target_link_libraries(test_cuda_mem PRIVATE khor_cuda)
  set_tests_properties(test_cuda_mem PROPERTIES LABELS gpu)
endif()
# KHOR_NCCL and the NCCL path for device buffers (runtime/nccl.c), one executable built
# everywhere (it opens libcuda itself): suite nccl runs here on the emulated device (label
# nccl), suite nccl_gpu skips with the reason where no GPU is usable (label gpu).
add_executable(test_nccl cuda/test_nccl.c)
target_link_libraries(test_nccl PRIVATE khor_testlib khor_mem_emu)
add_test(NAME test_nccl COMMAND test_nccl --jobs 1 --filter "nccl/*")
set_tests_properties(test_nccl PROPERTIES TIMEOUT 600 LABELS nccl)
add_test(NAME test_nccl_gpu COMMAND test_nccl --jobs 1 --filter "nccl_gpu/*")
set_tests_properties(test_nccl_gpu PROPERTIES TIMEOUT 900 LABELS gpu)
