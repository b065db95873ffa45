# Writes the build's version.cc (core/include/freeflow/version.h): run at every build with
#   cmake -DSOURCE_DIR=... -DVERSION=... -DINPUT=version.cc.in -DOUTPUT=version.cc -P version.cmake
# The commit is the short hash of SOURCE_DIR's HEAD, with "-dirty" when a tracked file differs
# from it (untracked files do not count), or "unknown" when SOURCE_DIR is not the top of a git
# work tree (a tarball, or no git). configure_file leaves OUTPUT alone when nothing changed,
# so an unchanged commit rebuilds nothing.
set(FF_VERSION "${VERSION}")
set(FF_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --show-toplevel
                  OUTPUT_VARIABLE top RESULT_VARIABLE top_failed
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT top_failed)
    file(REAL_PATH "${top}" top)
    file(REAL_PATH "${SOURCE_DIR}" source)
  endif()
  if(NOT top_failed AND top STREQUAL source)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --short HEAD
                    OUTPUT_VARIABLE hash RESULT_VARIABLE hash_failed
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT hash_failed)
      set(FF_COMMIT "${hash}")
      # Exit status 1: the index or a tracked file differs from HEAD.
      execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} diff --quiet --no-ext-diff HEAD --
                      RESULT_VARIABLE dirty OUTPUT_QUIET ERROR_QUIET)
      if(dirty EQUAL 1)
        string(APPEND FF_COMMIT "-dirty")
      endif()
    endif()
  endif()
endif()
configure_file(${INPUT} ${OUTPUT} @ONLY)
