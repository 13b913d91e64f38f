# kernel-bench: memcpy vs the reduction kernels, bytes/s per dtype (bench/kernel_bench.c).
# It links only the collectives layer so it times the kernels and nothing else.
add_executable(kernel-bench ${CMAKE_CURRENT_SOURCE_DIR}/kernel_bench.c)
target_link_libraries(kernel-bench PRIVATE khor_collectives)
