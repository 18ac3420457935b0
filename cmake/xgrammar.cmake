# XGrammar's C++ core (structured output, src/grammar/): built once from its pinned PyPI source
# distribution by scripts/xgrammar-deps.sh into ~/.cache/tessera/xgrammar (outside the
# repository), then imported here as a static library. The first configure on a fresh machine
# runs the build (minutes on 2 cores: docs/design/structured-output.md); later ones return at once.
execute_process(COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/../scripts/xgrammar-deps.sh
  OUTPUT_VARIABLE XGRAMMAR_OUT RESULT_VARIABLE XGRAMMAR_RC OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT XGRAMMAR_RC EQUAL 0)
  message(FATAL_ERROR "scripts/xgrammar-deps.sh failed (exit ${XGRAMMAR_RC}): XGrammar is needed for structured output")
endif()
string(REGEX REPLACE ".*\n" "" XGRAMMAR_PREFIX "${XGRAMMAR_OUT}")  # its last line
message(STATUS "XGrammar: ${XGRAMMAR_PREFIX}")
add_library(xgrammar::xgrammar STATIC IMPORTED GLOBAL)
set_target_properties(xgrammar::xgrammar PROPERTIES
  IMPORTED_LOCATION ${XGRAMMAR_PREFIX}/lib/libxgrammar.a
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES ${XGRAMMAR_PREFIX}/include
  INTERFACE_INCLUDE_DIRECTORIES ${XGRAMMAR_PREFIX}/include
  INTERFACE_COMPILE_DEFINITIONS "XGRAMMAR_ENABLE_CPPTRACE=0;XGRAMMAR_ENABLE_INTERNAL_CHECK=0"
  INTERFACE_LINK_LIBRARIES Threads::Threads)
