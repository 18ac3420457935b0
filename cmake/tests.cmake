# The unit test binary (every tests/unit/**/*.cpp), the end-to-end suite and the layer check.
enable_testing()
find_package(GTest REQUIRED)
include(GoogleTest)
file(GLOB_RECURSE TESSERA_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/unit/*.cpp)
add_executable(tessera_tests ${TESSERA_TEST_SOURCES})
tessera_warnings(tessera_tests)
target_include_directories(tessera_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
# Tests may reach into any layer (and its internals); the layering binds src/ only.
target_link_libraries(tessera_tests PRIVATE tessera_lib GTest::gtest GTest::gtest_main)
target_compile_definitions(tessera_tests PRIVATE
  TESSERA_FIXTURES_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
gtest_discover_tests(tessera_tests DISCOVERY_TIMEOUT 60
  PROPERTIES ENVIRONMENT "TESSERA_BIN=${CMAKE_BINARY_DIR}/bin/tessera")
include(${CMAKE_SOURCE_DIR}/tests/e2e/e2e.cmake)

# The include check of docs/design/layers.md, on the tree and on its own bad examples.
add_test(NAME check_layers COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/check-layers.sh)
add_test(NAME check_layers_selftest
  COMMAND python3 ${CMAKE_SOURCE_DIR}/scripts/check_layers.py --selftest)
