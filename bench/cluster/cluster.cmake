# cluster.cmake -- khor-model (the cost model as a tool) and the netns cluster check.
# Included from the top CMakeLists.txt after the khor_collectives and khor-bench targets.
#
# khor-model calls the cost functions of collectives/select.c directly (not through
# libkhor.so, which exports only khor_*), so it links the static layer.
add_executable(khor-model ${CMAKE_CURRENT_SOURCE_DIR}/khor_model.c)
target_link_libraries(khor-model PRIVATE khor_collectives m)

# The simulated-cluster test needs root and network namespaces; without them it exits 77,
# which CTest reports as skipped. It builds kernel objects, so it never runs in parallel
# with another test that might (RESOURCE_LOCK).
if(KHOR_BUILD_TESTS AND CRITERION_FOUND)
  add_test(NAME cluster.netns_allreduce
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster/test_cluster.sh $<TARGET_FILE:khor-bench>)
  set_tests_properties(cluster.netns_allreduce PROPERTIES
    SKIP_RETURN_CODE 77 TIMEOUT 300 RESOURCE_LOCK netns LABELS "cluster;root")
endif()
