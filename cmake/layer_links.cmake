# The link check: for each layer, a tiny program links ALL of the layer's objects
# (whole archive) against only the layers it lists. A .cpp that calls into a layer its
# library does not list leaves an undefined symbol, and the build stops at that link,
# naming the symbol. `tessera` depends on these programs, so `make build` runs the check.
# (Static libraries alone would not catch it: the final program links every layer.)
option(TESSERA_LAYER_LINK_CHECK "Link each layer alone against its listed dependencies" ON)
if(TESSERA_LAYER_LINK_CHECK)
  set(probes)
  foreach(layer IN LISTS TESSERA_LAYERS)
    set(probe tessera_link_${layer})
    add_executable(${probe} EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/link_probe.cpp)
    set_target_properties(${probe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/layer_links)
    target_link_libraries(${probe} PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,tessera_${layer}>")
    list(APPEND probes ${probe})
  endforeach()
  add_custom_target(tessera_layer_links DEPENDS ${probes})
  add_dependencies(tessera tessera_layer_links)
endif()
