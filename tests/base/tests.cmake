# tests/base -- the tests of base/ (included by tests/CMakeLists.txt).
khor_test(test_base base/test_base.c 60)
