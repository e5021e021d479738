# Writes OUT (the build's bin/commit.txt) with the commit of the source tree SRC, as
# `git rev-parse HEAD` prints it, when that differs from the file's content (so nothing is
# touched when the commit is unchanged). bench/gpu/run_bench.sh records this commit for the
# binaries it runs: the checkout beside them (e.g. a copy of the tree on the GPU machine) may be
# at another one. Run at every build by the target megatron_commit_txt (CMakeLists.txt).
#   cmake -DGIT=<git> -DSRC=<source dir> -DOUT=<file> -P write_commit.cmake
execute_process(COMMAND ${GIT} -C ${SRC} rev-parse HEAD OUTPUT_VARIABLE sha RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR sha STREQUAL "")
  set(sha "unknown")
endif()
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL "${sha}\n")
  file(WRITE ${OUT} "${sha}\n")
endif()
