# Reduction kernels: every dtype x op against a double-precision reference.
khor_test(test_reduce collectives/test_reduce.c 120)
