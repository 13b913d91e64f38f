# tests/rendezvous -- the tests of rendezvous/ (included by tests/CMakeLists.txt).
khor_test(test_store rendezvous/test_store.c 120)
# etcd as the store, against a real etcd server each test starts (tests/rendezvous/
# etcd_proc.h; skipped without Debian's etcd-server, which .ci/packages --etcd installs),
# and a 3-rank job of the allreduce example that meets through it.
khor_test(test_store_etcd rendezvous/test_store_etcd.c 120)
target_compile_definitions(test_store_etcd PRIVATE
  KHOR_EXAMPLE_ALLREDUCE="$<TARGET_FILE:example-allreduce>")
add_dependencies(test_store_etcd example-allreduce)
