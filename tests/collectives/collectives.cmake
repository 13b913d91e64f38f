khor_test(test_collectives collectives/test_collectives.c 900)
