# ff_integration_test(NAME SCRIPT script TIMEOUT seconds [ARGS arg...] [ENV VAR=value...]
#                     [LABELS label...])
# Registers the CTest integration.NAME: `bash SCRIPT ARGS...`, SCRIPT in the calling folder.
# Every integration test runs alone (RUN_SERIAL: they need root, make network namespaces and
# start real routers), has the label integration (and LABELS), and finds the build through
# FF_BUILD (and ENV: the programs it runs, as generator expressions such as
# $<TARGET_FILE:...>).
function(ff_integration_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "SCRIPT;TIMEOUT" "ARGS;ENV;LABELS")
  if(arg_UNPARSED_ARGUMENTS OR NOT arg_SCRIPT OR NOT arg_TIMEOUT)
    message(FATAL_ERROR "ff_integration_test(${name}): give SCRIPT and TIMEOUT "
                        "(not understood: ${arg_UNPARSED_ARGUMENTS})")
  endif()
  set(labels integration ${arg_LABELS})
  set(environment FF_BUILD=${CMAKE_BINARY_DIR} ${arg_ENV})
  add_test(NAME integration.${name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${arg_SCRIPT} ${arg_ARGS})
  set_tests_properties(integration.${name} PROPERTIES
    LABELS "${labels}" RUN_SERIAL TRUE TIMEOUT ${arg_TIMEOUT} ENVIRONMENT "${environment}")
endfunction()
