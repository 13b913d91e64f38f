# ib.cmake -- the verbs transport. Built whenever infiniband/verbs.h is there (Debian's
# libibverbs-dev); libibverbs itself is loaded at run time (ib_load.c), so libkhor runs on
# machines without rdma-core and ib reports itself unavailable there. GPUDirect RDMA
# registration uses the CUDA driver API, loaded at run time too; cuda.h is only needed
# for its types and is used when the CUDA toolkit is found.
if(KHOR_IBVERBS_INC)
  target_sources(khor_transport PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ib.c
    ${CMAKE_CURRENT_LIST_DIR}/ib_load.c ${CMAKE_CURRENT_LIST_DIR}/ib_gdr.c)
  target_include_directories(khor_transport PRIVATE ${KHOR_IBVERBS_INC})
  target_compile_definitions(khor_transport PUBLIC KHOR_HAVE_IB)
  if(CUDAToolkit_FOUND)
    target_include_directories(khor_transport PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_definitions(khor_transport PRIVATE KHOR_HAVE_CUDA_H)
  endif()
endif()
