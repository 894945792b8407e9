# Writes OUTPUT (a .cpp defining attnprobe::kGitHash) from the source tree's git state, at every build:
# run.json records it, and `merge` refuses shards of different builds, so a hash read once at configure
# time went stale with the next commit. configure_file rewrites OUTPUT only when the text changes, so an
# unchanged tree recompiles nothing. "-dirty": tracked files differ from HEAD; "unknown": no git (a
# source tarball). Arguments: -DSOURCE_DIR= -DOUTPUT=.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE rc
                OUTPUT_VARIABLE ATTNPROBE_GIT_HASH OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT ATTNPROBE_GIT_HASH)
  set(ATTNPROBE_GIT_HASH "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND ATTNPROBE_GIT_HASH "-dirty")
  endif()
endif()
file(CONFIGURE OUTPUT ${OUTPUT} CONTENT [[// Generated at build time by cmake/write_git_hash.cmake.
#include "attnprobe/version.h"
namespace attnprobe {
const char* const kGitHash = "@ATTNPROBE_GIT_HASH@";
}  // namespace attnprobe
]] @ONLY)
