# cuda/cuda.cmake -- the CUDA reduction kernels (khor_cuda), built with nvcc where the
# toolkit was found (find_package(CUDAToolkit) in the top CMakeLists.txt), skipped with a
# line in the configure output where it was not.
#
# nvcc is called directly from a custom command rather than through enable_language(CUDA):
# the top-level add_compile_options (-Wstrict-prototypes, -Wshadow, the sanitizers) would
# be handed to nvcc and to g++ in C++ mode, where they are errors or wrong, and CMake 3.25
# predates CUDA 13's architecture list. The object goes into a static library of its own,
# which khor_collectives links for the cuda backend of the memory seam (cuda/mem_cuda.c,
# added to khor_collectives in the top CMakeLists.txt once that library exists).
#
# No -ftz, no --use_fast_math: the f16 conversions copied from reduce.c need subnormals.
# --fmad=false: no FMA contraction the CPU kernels don't do, so the bits match.
# -fno-exceptions and -fno-threadsafe-statics: nvcc's launch stubs then need nothing from
# libstdc++ (no __cxa_guard_*, no personality), so C programs and libkhor link khor_cuda as is.
set(KHOR_HAVE_CUDA_KERNELS OFF)
if(KHOR_CUDA AND CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
  set(KHOR_HAVE_CUDA_KERNELS ON)
  set(KHOR_CUDA_ARCH_FLAGS
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
    CACHE STRING "nvcc -gencode flags for the CUDA kernels (default: H100/H200 SASS + PTX)")
  set(khor_cuda_flags -std=c++17 -O3 --fmad=false ${KHOR_CUDA_ARCH_FLAGS}
    -Xcompiler -fPIC,-fvisibility=hidden,-fno-exceptions,-fno-threadsafe-statics,-Wall,-Wextra)
  if(KHOR_WERROR)
    list(APPEND khor_cuda_flags -Werror all-warnings -Xcompiler -Werror)
  endif()
  if(CMAKE_CUDA_HOST_COMPILER)
    list(APPEND khor_cuda_flags -ccbin ${CMAKE_CUDA_HOST_COMPILER})
  endif()
  if(CMAKE_BUILD_TYPE MATCHES "Debug|RelWithDebInfo")
    list(APPEND khor_cuda_flags -g -lineinfo)
  endif()

  set(khor_cuda_obj ${CMAKE_BINARY_DIR}/cuda/reduce.cu.o)
  add_custom_command(OUTPUT ${khor_cuda_obj}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/cuda
    COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} ${khor_cuda_flags}
            -I${CMAKE_SOURCE_DIR}/include -I${CMAKE_SOURCE_DIR}
            -MD -MF ${khor_cuda_obj}.d
            -c ${CMAKE_SOURCE_DIR}/cuda/reduce.cu -o ${khor_cuda_obj}
    DEPENDS ${CMAKE_SOURCE_DIR}/cuda/reduce.cu ${CMAKE_SOURCE_DIR}/cuda/reduce_cuda.h
            ${CMAKE_SOURCE_DIR}/include/khor.h ${CMAKE_SOURCE_DIR}/cuda/cuda.cmake
    DEPFILE ${khor_cuda_obj}.d
    COMMENT "Building CUDA kernels cuda/reduce.cu with nvcc"
    VERBATIM)
  set_source_files_properties(${khor_cuda_obj} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)

  add_library(khor_cuda STATIC ${khor_cuda_obj})
  set_target_properties(khor_cuda PROPERTIES LINKER_LANGUAGE C)
  target_include_directories(khor_cuda INTERFACE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR})
  target_compile_definitions(khor_cuda INTERFACE KHOR_HAVE_CUDA_KERNELS)
  # The static runtime loads libcuda.so itself at run time, so linking khor_cuda leaves no
  # hard dependency on a CUDA installation (DESIGN.md, "Memory").
  target_link_libraries(khor_cuda INTERFACE CUDA::cudart_static)
  string(REPLACE ";" " " s_arch "${KHOR_CUDA_ARCH_FLAGS}")
  message(STATUS "  CUDA kernels: built (khor_cuda, nvcc ${CUDAToolkit_VERSION}, ${s_arch}); in libkhor as the cuda memory backend")
elseif(CUDAToolkit_FOUND)
  message(STATUS "  CUDA kernels: not built (no nvcc in the toolkit at ${CUDAToolkit_BIN_DIR})")
elseif(NOT KHOR_CUDA)
  message(STATUS "  CUDA kernels: not built (KHOR_CUDA=OFF)")
else()
  message(STATUS "  CUDA kernels: not built (no CUDA toolkit; set CUDAToolkit_ROOT to build them)")
endif()
