# cmake -P script: install kiln into a scratch prefix, check what went in, and build and run the consumers
# from it: tests/consumer/project (C++, find_package(kiln CONFIG), kiln::kiln) and, with KILN_SHARED,
# tests/consumer/c_project (C, pkg-config kiln) and examples/dsl built on its own (C, find_package(kiln)), plus
# what libkiln.so exports.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
# Consumers keep their cache here, and choose their executor themselves (the default: the process pool).
set(ENV{KILN_CACHE_DIR} ${WORK_DIR}/cache)
unset(ENV{KILN_EXECUTOR})
unset(ENV{KILN_COMPILE_WORKER})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
  set(last_error "${err}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${KILN_BUILD_DIR} --prefix ${prefix})

# Only public headers are installed: none may be a copy of a header from a room's src/, tests/ or bench/.
file(GLOB_RECURSE internal LIST_DIRECTORIES false
  ${SOURCE_DIR}/*/src/*.h ${SOURCE_DIR}/*/*/src/*.h ${SOURCE_DIR}/*/src/*.cuh ${SOURCE_DIR}/tests/*.h ${SOURCE_DIR}/bench/*.h)
set(internal_hashes "")
foreach(f ${internal})
  file(SHA256 ${f} h)
  list(APPEND internal_hashes "${h}")
endforeach()
file(GLOB_RECURSE installed LIST_DIRECTORIES false ${prefix}/include/*)
list(LENGTH installed n_installed)
if(n_installed EQUAL 0)
  message(FATAL_ERROR "cmake --install put no header in ${prefix}/include")
endif()
foreach(f ${installed})
  file(SHA256 ${f} h)
  list(FIND internal_hashes "${h}" at)
  if(NOT at EQUAL -1)
    list(GET internal ${at} source)
    message(FATAL_ERROR "cmake --install shipped an internal header: ${f} is ${source}")
  endif()
endforeach()
# A kiln built with sanitizers needs their runtimes first in every program that loads it (ASan refuses to start
# otherwise): the consumers are built with the same -fsanitize, as a user of such a build would.
set(flags "")
set(c_sanitize "")
if(SANITIZE)
  set(flags "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
  set(c_sanitize "-fsanitize=${SANITIZE}")
endif()
run(${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix}
    -DCUDAToolkit_ROOT=${CUDA_ROOT} ${flags})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/kiln_consumer)
if(NOT last_output MATCHES "key [0-9a-f]+")
  message(FATAL_ERROR "unexpected consumer output: ${last_output}")
endif()
string(REGEX MATCH "key ([0-9a-f]+)" _ "${last_output}")
string(LENGTH "${CMAKE_MATCH_1}" n)
if(NOT n EQUAL 32)
  message(FATAL_ERROR "the consumer printed a key of ${n} characters: ${last_output}")
endif()
message(STATUS "consumer output: ${last_output}")

if(NOT SHARED)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/check_exports.cmake)

# The C consumer, through pkg-config only.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/${LIBDIR}/pkgconfig
                        ${PKG_CONFIG} --cflags --libs kiln
                RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags ERROR_VARIABLE pc_err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config kiln failed: ${pc_err}")
endif()
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
file(MAKE_DIRECTORY ${WORK_DIR}/c)
run(${C_COMPILER} -std=c99 -Wall -Wextra -pedantic -Werror ${c_sanitize} ${CMAKE_CURRENT_LIST_DIR}/c_project/main.c ${pc_flags}
    -o ${WORK_DIR}/c/kiln_c_consumer)
run(${WORK_DIR}/c/kiln_c_consumer)
if(NOT last_output MATCHES "\\(C, pkg-config\\): key [0-9a-f]+")
  message(FATAL_ERROR "unexpected C consumer output: ${last_output}\n${last_error}")
endif()
# Its compile worker was found relative to libkiln.so (prefix/bin), so no fallback was taken.
if(last_error MATCHES "instead of the process pool")
  message(FATAL_ERROR "the installed kiln did not find its compile worker:\n${last_error}")
endif()
message(STATUS "C consumer output: ${last_output}")

# examples/dsl on its own, as a DSL's project: find_package(kiln) from the prefix, C only.
set(dsl_flags "")
if(SANITIZE)
  set(dsl_flags "-DCMAKE_C_FLAGS=-fsanitize=${SANITIZE}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/dsl -B ${WORK_DIR}/dsl -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCUDAToolkit_ROOT=${CUDA_ROOT} ${dsl_flags})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/dsl)
run(${WORK_DIR}/dsl/ewdsl-demo --source "a * x + y")
if(NOT last_output MATCHES "float4")
  message(FATAL_ERROR "the standalone DSL example printed no vectorised source:\n${last_output}\n${last_error}")
endif()
run(${WORK_DIR}/dsl/ewdsl-demo --precompile sm_90 "sum(x * x)")
if(NOT last_output MATCHES "compiled 6 variants")
  message(FATAL_ERROR "the standalone DSL example did not precompile its variants:\n${last_output}\n${last_error}")
endif()
message(STATUS "standalone DSL example: ${last_output}")

# Without the worker executable the consumer still compiles, and says once on stderr which fallback it takes.
set(worker ${prefix}/${BINDIR}/kiln-compile-worker)
if(NOT EXISTS ${worker})
  message(FATAL_ERROR "cmake --install did not install ${worker}")
endif()
# An empty cache: the kernel must really compile (the pool starts at the first compile, so a cache hit would
# never look for the worker).
file(RENAME ${worker} ${worker}.away)
set(ENV{KILN_CACHE_DIR} ${WORK_DIR}/cache-without-worker)
file(REMOVE_RECURSE ${WORK_DIR}/cache-without-worker)
execute_process(COMMAND ${WORK_DIR}/c/kiln_c_consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(ENV{KILN_CACHE_DIR} ${WORK_DIR}/cache)
file(RENAME ${worker}.away ${worker})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "without its worker the C consumer failed (${rc}):\n${out}\n${err}")
endif()
string(REGEX MATCHALL "compiling in this process \\(a TBB arena\\)" said "${err}")
list(LENGTH said times)
if(NOT times EQUAL 1)
  message(FATAL_ERROR "without its worker, kiln should say once that it compiles in the process; stderr was:\n${err}")
endif()
message(STATUS "without the worker: ${err}")
