# Sanitizer builds (scripts/ci-sanitizers.sh). The sanitizer flags come from the command line
# (CMAKE_CXX_FLAGS, with CMAKE_BUILD_TYPE=Sanitize, which adds none of its own); this file only
# adds the test binary of the threaded layers that ThreadSanitizer runs, so a TSan build compiles
# the library and these tests, not the whole suite. EXCLUDE_FROM_ALL: ordinary builds skip it.
if(TESSERA_BUILD_TESTS)
  file(GLOB TESSERA_CONCURRENCY_TEST_SOURCES CONFIGURE_DEPENDS
    ${CMAKE_SOURCE_DIR}/tests/unit/engine/*.cpp
    ${CMAKE_SOURCE_DIR}/tests/unit/sched/*.cpp
    ${CMAKE_SOURCE_DIR}/tests/unit/http/*.cpp
    ${CMAKE_SOURCE_DIR}/tests/unit/api/api_server_test.cpp)
  # Not these: single-threaded numerics on a real model (SmolLM2 forward passes, calibration),
  # whose engine-thread paths the simulator tests cover; under TSan they took over 10 minutes
  # of a CI run (2026-12-03). ASan and the Release suite run them.
  list(FILTER TESSERA_CONCURRENCY_TEST_SOURCES EXCLUDE REGEX
    "/engine/(engine_grammar_real_model|engine_quant_kv|engine_real_model|engine_spec_real_model|kv_calibration|model_runner)_test\\.cpp$")
  add_executable(tessera_concurrency_tests EXCLUDE_FROM_ALL ${TESSERA_CONCURRENCY_TEST_SOURCES})
  target_include_directories(tessera_concurrency_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(tessera_concurrency_tests PRIVATE tessera_lib GTest::gtest GTest::gtest_main)
  target_compile_definitions(tessera_concurrency_tests PRIVATE
    TESSERA_FIXTURES_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
endif()
