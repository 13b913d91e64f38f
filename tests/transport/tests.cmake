# tests/transport -- the tests of transport/ (included by tests/CMakeLists.txt).
khor_test(test_tcp transport/test_tcp.c 120)
khor_test(test_tcp_frames transport/test_tcp_frames.c 60)
# Two ranks forked per case (pair.c): the contract every transport keeps, run over each one
# built (tcp, shm, shm with CMA; ib where an RDMA device is, else its cases skip saying
# why), and shm's own behaviour.
khor_test(test_contract transport/test_contract.c 300)
target_sources(test_contract PRIVATE transport/pair.c)
khor_test(test_shm transport/test_shm.c 120)
target_sources(test_shm PRIVATE transport/pair.c)
khor_test(test_handshake transport/test_handshake.c 60)
khor_test(test_regcache transport/test_regcache.c 120)
# ib: the device tests skip here (no RDMA in this kernel) but the reason ib gives is
# checked; the VM below runs them on soft-RoCE.
khor_test(test_ib transport/test_ib.c 900)
# The ib tests on soft-RoCE, in a qemu VM with Debian's kernel (tests/ib/vm.sh; exit 77, a
# skip, where qemu or that kernel can't be had): tests/ib/ib_suite.sh's full suite, about
# 2-3 minutes under TCG. The build tree is the VM's writable share.
# The suite is copied into the build tree, since the guest sees only the share and the
# host's root (not a source tree under /tmp, where the guest has a tmpfs of its own).
if(KHOR_IBVERBS_INC)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/../ib/ib_suite.sh ${CMAKE_BINARY_DIR}/tests/ib_suite.sh
    COPYONLY)
  # Under the sanitizers the quick suite, the ib code under ASan at n = 2 (run by hand: CI
  # leaves it out of its ASan run for time, .ci/test); the plain build runs the full one.
  if(KHOR_SANITIZE)
    set(KHOR_IB_SUITE quick)
  else()
    set(KHOR_IB_SUITE full)
  endif()
  add_test(NAME ib_softroce COMMAND ${CMAKE_CURRENT_LIST_DIR}/../ib/vm.sh --timeout 1500
    --share ${CMAKE_BINARY_DIR} -- ${CMAKE_BINARY_DIR}/tests/ib_suite.sh
    ${CMAKE_BINARY_DIR} ${KHOR_IB_SUITE}
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(ib_softroce PROPERTIES LABELS ib TIMEOUT 1600 SKIP_RETURN_CODE 77)
endif()
# Interfaces whose names differ across hosts, with a dead management NIC first: the ranks
# publish every candidate and dial what they can reach (exit 77 without root).
add_test(NAME test_ifaces COMMAND ${CMAKE_CURRENT_LIST_DIR}/../ifaces/test_ifaces.sh
  $<TARGET_FILE:khor-bench>)
set_tests_properties(test_ifaces PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 RESOURCE_LOCK netns
  LABELS root)
