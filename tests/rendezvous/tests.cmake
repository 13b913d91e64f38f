# tests/rendezvous -- the tests of rendezvous/ (included by tests/CMakeLists.txt).
khor_test(test_store rendezvous/test_store.c 120)
