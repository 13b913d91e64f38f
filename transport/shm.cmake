# shm.cmake -- the shared-memory transport, its tests and its ping-pong benchmark.
# Included from the top-level CMakeLists.txt after khor_transport is defined; its test is
# registered in tests/CMakeLists.txt with the others.
target_sources(khor_transport PRIVATE ${CMAKE_CURRENT_LIST_DIR}/shm.c)

add_executable(shm-pingpong ${CMAKE_SOURCE_DIR}/bench/shm_pingpong.c)
target_link_libraries(shm-pingpong PRIVATE khor_transport)

