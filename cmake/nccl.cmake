# The NCCL communicator layer, tessera_parallel_nccl (included by cmake/layers.cmake after
# tessera_parallel). With the CUDA backend and NCCL found (the toolkit's lib/libnccl.so) it
# holds src/parallel/nccl/nccl_comm.cpp; otherwise only nccl_unavailable.cpp, which says the
# build lacks NCCL. It reaches the CUDA backend's stream, so it comes after tessera_backend_cuda.
set(TESSERA_NCCL_DEFAULT OFF)
if(TESSERA_CUDA)
  find_library(TESSERA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR}
    /usr/local/cuda/lib /usr/local/cuda/lib64)
  find_path(TESSERA_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(TESSERA_NCCL_LIBRARY AND TESSERA_NCCL_INCLUDE)
    set(TESSERA_NCCL_DEFAULT ON)
  endif()
endif()
option(TESSERA_NCCL "Build the NCCL communicator (needs the CUDA backend and libnccl)" ${TESSERA_NCCL_DEFAULT})

if(TESSERA_NCCL)
  tessera_layer(parallel_nccl DIRS src/parallel/nccl EXCLUDE src/parallel/nccl/nccl_unavailable.cpp
    PUBLIC parallel backend core PRIVATE backend_cuda)
  target_include_directories(tessera_parallel_nccl PRIVATE ${TESSERA_NCCL_INCLUDE})
  target_link_libraries(tessera_parallel_nccl PRIVATE ${TESSERA_NCCL_LIBRARY} CUDA::cudart_static)
  message(STATUS "tessera: NCCL communicator ON (${TESSERA_NCCL_LIBRARY})")
else()
  tessera_layer(parallel_nccl FILES src/parallel/nccl/nccl_unavailable.cpp PUBLIC parallel backend core)
  message(STATUS "tessera: NCCL communicator OFF")
endif()
