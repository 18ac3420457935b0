# One static library per layer of docs/design/layers.md, named tessera_<layer>.
#
# The table below is the one source of truth for the layering: CMake builds and links
# from it, and scripts/check-layers.sh reads the same tessera_layer(...) calls to reject
# an #include of a layer that is not listed. PUBLIC lists the layers this layer's headers
# include (its users see them too); PRIVATE the layers only its .cpp files include.
# Each folder is globbed (CONFIGURE_DEPENDS), so a .cpp added to a folder lands in its
# layer's library without editing this file.
#
# tessera_layer(<name> [DIRS <folder>...] [FILES <file>...] [EXCLUDE <file>...]
#               [PUBLIC <layer>...] [PRIVATE <layer>...] [LIBS <imported target>...])

include(${CMAKE_CURRENT_LIST_DIR}/warnings.cmake)

set(TESSERA_LAYERS "" CACHE INTERNAL "every tessera_layer() name, in definition order")

function(tessera_layer name)
  cmake_parse_arguments(L "" "" "DIRS;FILES;EXCLUDE;PUBLIC;PRIVATE;LIBS" ${ARGN})
  set(sources)
  foreach(dir IN LISTS L_DIRS)
    file(GLOB found CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${dir}/*.cpp ${CMAKE_SOURCE_DIR}/${dir}/*.cu)
    list(APPEND sources ${found})
  endforeach()
  foreach(f IN LISTS L_FILES)
    list(APPEND sources ${CMAKE_SOURCE_DIR}/${f})
  endforeach()
  foreach(f IN LISTS L_EXCLUDE)
    list(REMOVE_ITEM sources ${CMAKE_SOURCE_DIR}/${f})
  endforeach()
  if(NOT sources)
    message(FATAL_ERROR "tessera_layer(${name}): no source files in ${L_DIRS} ${L_FILES}")
  endif()
  # Kernel files carry their instruction set in their name and get the matching flags;
  # the rest is built for baseline x86-64 and picks a kernel at run time.
  foreach(f IN LISTS sources)
    if(f MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16;-mavx2;-mfma;-mf16c")
    elseif(f MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2")
    endif()
  endforeach()

  set(target tessera_${name})
  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  tessera_warnings(${target})
  list(TRANSFORM L_PUBLIC PREPEND tessera_)
  list(TRANSFORM L_PRIVATE PREPEND tessera_)
  target_link_libraries(${target} PUBLIC ${L_PUBLIC} ${L_LIBS} PRIVATE ${L_PRIVATE})
  set(TESSERA_LAYERS ${TESSERA_LAYERS} ${name} CACHE INTERNAL "")
endfunction()

# From the bottom up. A layer may only name layers above it in this list.
tessera_layer(core      DIRS src/core LIBS Threads::Threads)
tessera_layer(format    DIRS src/format PUBLIC core LIBS nlohmann_json::nlohmann_json)
tessera_layer(quant     DIRS src/quant PUBLIC core)
# The op interface (backend.h, tensor.h) and what every backend shares; not the registry.
tessera_layer(backend   DIRS src/backend EXCLUDE src/backend/registry.cpp PUBLIC core)
tessera_layer(backend_cpu DIRS src/backend/cpu PUBLIC backend core PRIVATE quant)
include(${CMAKE_CURRENT_LIST_DIR}/cuda.cmake)  # tessera_backend_cuda (or its stand-in)
# The registry is the only code that knows both backends, so they never depend on each other.
tessera_layer(backend_registry FILES src/backend/registry.cpp
  PUBLIC backend PRIVATE core backend_cpu backend_cuda)
tessera_layer(kv        DIRS src/kv PUBLIC core backend LIBS OpenSSL::Crypto)
# Tensor parallelism's collectives: the interface, the in-process group, the TCP rendezvous.
tessera_layer(parallel  DIRS src/parallel PUBLIC core)
include(${CMAKE_CURRENT_LIST_DIR}/nccl.cmake)  # tessera_parallel_nccl (or its stand-in)
tessera_layer(model     DIRS src/model src/model/arch src/model/tp src/model/pp PUBLIC core backend kv parallel PRIVATE quant format
  LIBS nlohmann_json::nlohmann_json)
tessera_layer(sample    DIRS src/sample PUBLIC core)
tessera_layer(sched     DIRS src/sched PUBLIC core kv sample)
# Speculative decoding: drafters, exact verification, the per-request draft length policy.
tessera_layer(spec      DIRS src/spec PUBLIC core sample LIBS nlohmann_json::nlohmann_json)
tessera_layer(tokenizer DIRS src/tokenizer PUBLIC core PRIVATE format
  LIBS PkgConfig::PCRE2 nlohmann_json::nlohmann_json)
# Structured output: grammars compiled for the vocabulary and per-sequence token masks (XGrammar).
include(${CMAKE_CURRENT_LIST_DIR}/xgrammar.cmake)
tessera_layer(grammar   DIRS src/grammar PUBLIC core PRIVATE tokenizer
  LIBS xgrammar::xgrammar nlohmann_json::nlohmann_json)
tessera_layer(template  DIRS src/template PUBLIC core PRIVATE tokenizer LIBS nlohmann_json::nlohmann_json)
tessera_layer(engine    DIRS src/engine PUBLIC core backend kv model sample sched spec grammar parallel
  PRIVATE backend_registry tokenizer format parallel_nccl LIBS nlohmann_json::nlohmann_json)
# Prefill/decode disaggregation: the KV transport (wire format, TCP with host staging) between
# engines, through the engine's API (engine/engine.h, engine/kv_transfer.h).
tessera_layer(disagg    DIRS src/disagg PUBLIC core kv engine LIBS Boost::headers OpenSSL::Crypto)
# The server reaches the scheduler only through the engine's API (engine/engine.h, engine/request.h).
tessera_layer(server    DIRS src/server src/server/api src/server/http src/server/web src/server/router
  PUBLIC core engine sample tokenizer disagg PRIVATE template grammar
  LIBS Boost::headers OpenSSL::Crypto nlohmann_json::nlohmann_json)
# Tools above the engine, kept out of it.
tessera_layer(eval      DIRS src/eval PUBLIC core PRIVATE engine tokenizer)
tessera_layer(bench     DIRS src/bench PUBLIC core PRIVATE backend_cpu)
tessera_layer(benchharness DIRS src/benchharness PUBLIC core engine model
  PRIVATE format tokenizer LIBS Boost::headers nlohmann_json::nlohmann_json)

# Every layer at once, for programs that drive the whole engine (tests, fuzz targets, tools).
# Code under src/ links the layers it lists instead.
add_library(tessera_lib INTERFACE)
list(TRANSFORM TESSERA_LAYERS PREPEND tessera_ OUTPUT_VARIABLE TESSERA_LAYER_TARGETS)
target_link_libraries(tessera_lib INTERFACE ${TESSERA_LAYER_TARGETS})

# The command line: a program, not a layer; it may use every layer it names here.
# tessera_program(<name> DIRS <folder>... PRIVATE <layer>...)
function(tessera_program name)
  cmake_parse_arguments(P "" "" "DIRS;PRIVATE" ${ARGN})
  set(sources)
  foreach(dir IN LISTS P_DIRS)
    file(GLOB found CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${dir}/*.cpp)
    list(APPEND sources ${found})
  endforeach()
  add_executable(${name} ${sources})
  tessera_warnings(${name})
  list(TRANSFORM P_PRIVATE PREPEND tessera_)
  target_link_libraries(${name} PRIVATE ${P_PRIVATE})
endfunction()

tessera_program(tessera DIRS src/apps PRIVATE core format model backend backend_cpu backend_cuda backend_registry
  parallel parallel_nccl
  sample tokenizer grammar template engine disagg server eval bench benchharness)

include(${CMAKE_CURRENT_LIST_DIR}/layer_links.cmake)
