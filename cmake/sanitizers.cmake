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
  add_executable(tessera_concurrency_tests EXCLUDE_FROM_ALL ${TESSERA_CONCURRENCY_TEST_SOURCES})
  target_include_directories(tessera_concurrency_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(tessera_concurrency_tests PRIVATE tessera_lib GTest::gtest GTest::gtest_main)
  target_compile_definitions(tessera_concurrency_tests PRIVATE
    TESSERA_FIXTURES_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
endif()
