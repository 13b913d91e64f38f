# tests/engine -- the tests of engine/ (included by tests/CMakeLists.txt).
khor_test(test_engine engine/test_engine.c 420)
khor_test(test_engine_device engine/test_engine_device.c 600)
target_link_libraries(test_engine_device PRIVATE khor_mem_emu)
khor_test(test_negotiate engine/test_negotiate.c 60)
khor_test(test_engine_settings engine/test_settings.c 60)
# The engine from three threads per rank, the same way: for -DKHOR_SANITIZE=thread, not a
# CTest test (test_engine covers the engine under Criterion).
add_executable(tsan_engine engine/tsan_engine.c harness.c ${PROJECT_SOURCE_DIR}/bindings/capi.c
  ${PROJECT_SOURCE_DIR}/bindings/capi_engine.c)
target_link_libraries(tsan_engine PRIVATE khor_engine m)
