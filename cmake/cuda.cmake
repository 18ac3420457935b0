# The CUDA backend layer, tessera_backend_cuda (included by cmake/layers.cmake).
# With a CUDA compiler it holds src/backend/cuda/; without one (TESSERA_CUDA=OFF) it holds
# only cuda_unavailable.cpp, and `--device cuda` says the build lacks CUDA. Either way the
# registry (tessera_backend_registry) is the only library that links it: the CPU backend and
# the CUDA one never depend on each other.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
include(CheckLanguage)
check_language(CUDA)
set(TESSERA_CUDA_DEFAULT OFF)
if(CMAKE_CUDA_COMPILER)
  set(TESSERA_CUDA_DEFAULT ON)
endif()
option(TESSERA_CUDA "Build the CUDA backend (needs nvcc and cuBLASLt)" ${TESSERA_CUDA_DEFAULT})
# Device code targets: Hopper machine code (sm_90a) plus compute_90 PTX the driver can JIT.
set(TESSERA_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a;-gencode=arch=compute_90,code=compute_90"
    CACHE STRING "nvcc -gencode flags of the CUDA backend")

if(TESSERA_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 does not know the C++20 flag of nvcc 13.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES OFF)  # the -gencode flags below say it
  set(CMAKE_CUDA_FLAGS_RELEASE "-O3 -DNDEBUG")
  tessera_layer(backend_cuda DIRS src/backend/cuda EXCLUDE src/backend/cuda/cuda_unavailable.cpp
    PUBLIC backend core PRIVATE quant)
  # PRIVATE: no header outside this folder includes the CUDA runtime, so no user compiles with it.
  target_link_libraries(tessera_backend_cuda PRIVATE CUDA::cudart_static CUDA::cublasLt)
  set_target_properties(tessera_backend_cuda PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(tessera_backend_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${TESSERA_CUDA_GENCODE}>)
  # Per-block kernel timestamps (src/backend/cuda/probe.cuh, tools/gpu/block_timeline.py).
  option(TESSERA_CUDA_PROBE "Record per-block timestamps in the decode kernels (diagnostics)" OFF)
  if(TESSERA_CUDA_PROBE)  # only the files that record or collect them
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/backend/cuda/gemv_bulk.cu
      ${CMAKE_SOURCE_DIR}/src/backend/cuda/attention_decode_mma.cu ${CMAKE_SOURCE_DIR}/src/backend/cuda/cuda_probe.cpp
      PROPERTIES COMPILE_DEFINITIONS TESSERA_CUDA_PROBE)
  endif()
  message(STATUS "tessera: CUDA backend ON (${CMAKE_CUDA_COMPILER_VERSION})")
else()
  tessera_layer(backend_cuda FILES src/backend/cuda/cuda_unavailable.cpp PUBLIC backend core)
  message(STATUS "tessera: CUDA backend OFF")
endif()
