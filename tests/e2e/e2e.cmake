# End-to-end tests (tests/e2e): the real `tessera serve` driven by the openai client,
# requests, prometheus_client and headless Chromium, from a pinned venv that
# scripts/test-venv.sh makes in the build directory. Serial: they time a real server and
# must not share the 2 cores with the unit suites. Skipped (77) only without the model.
add_test(NAME e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/run.sh ${CMAKE_BINARY_DIR})
set_tests_properties(e2e PROPERTIES
  TIMEOUT 600
  RUN_SERIAL TRUE
  SKIP_RETURN_CODE 77
  ENVIRONMENT "TESSERA_BIN=${CMAKE_BINARY_DIR}/bin/tessera")
