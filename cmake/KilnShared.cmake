# libkiln.so: every kiln static library in one shared library with the public C++ and C APIs (KILN_SHARED, on by
# default). Its objects are the static libraries' own (built once, position independent), so the static
# libraries stay what the tests and the tools in this tree link; the shared one is what an installed kiln gives
# as kiln::kiln.
#
# What it exports is fixed by a version script (cmake/kiln.map): the C API (kiln_*) and the kiln:: C++ API with
# its type information, nothing else. The libraries inside it (fmt, spdlog, nlohmann_json template code, the
# C++ standard library's instantiations) stay hidden, so a program using its own fmt or spdlog never meets
# kiln's. The C API is compiled with -fvisibility=hidden and marks its entry points KILN_API.
#
# SONAME libkiln.so.${KILN_ABI_VERSION}: bump KILN_ABI_VERSION when the ABI of the C API breaks.
set(KILN_ABI_VERSION 0)

get_property(kiln_libs GLOBAL PROPERTY KILN_LIBRARIES)
set(kiln_static_libs "")
set(kiln_shared_deps "")
foreach(lib ${kiln_libs})
  get_target_property(type ${lib} TYPE)
  if(NOT type STREQUAL "STATIC_LIBRARY")
    continue()
  endif()
  list(APPEND kiln_static_libs ${lib})
  # What each static library links, less kiln's own: the shared library links those instead.
  get_target_property(deps ${lib} LINK_LIBRARIES)
  foreach(dep ${deps})
    if(dep MATCHES "^kiln(::|_)" OR dep STREQUAL "deps-NOTFOUND")
      continue()
    endif()
    list(APPEND kiln_shared_deps ${dep})
  endforeach()
endforeach()
list(REMOVE_DUPLICATES kiln_shared_deps)

set(kiln_objects "")
foreach(lib ${kiln_static_libs})
  list(APPEND kiln_objects $<TARGET_OBJECTS:${lib}>)
  # Objects of object libraries a static library takes as sources (e.g. the templates' embedded ABI header).
  get_target_property(sources ${lib} SOURCES)
  foreach(src ${sources})
    if(src MATCHES "^\\$<TARGET_OBJECTS:")
      list(APPEND kiln_objects ${src})
    endif()
  endforeach()
endforeach()
add_library(kiln_shared SHARED ${kiln_objects})
add_library(kiln::shared ALIAS kiln_shared)
add_dependencies(kiln_shared ${kiln_static_libs})
set_target_properties(kiln_shared PROPERTIES
  OUTPUT_NAME kiln
  EXPORT_NAME kiln
  VERSION ${PROJECT_VERSION}
  SOVERSION ${KILN_ABI_VERSION}
  LINKER_LANGUAGE CXX
  # The CUDA libraries (NVRTC, cuBLAS) live outside the loader's default paths: keep them in its RUNPATH.
  INSTALL_RPATH_USE_LINK_PATH TRUE
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/kiln.map)
target_link_libraries(kiln_shared PRIVATE ${kiln_shared_deps})
target_link_options(kiln_shared PRIVATE
  LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/kiln.map
  LINKER:--no-undefined)
get_property(kiln_include_dirs GLOBAL PROPERTY KILN_PUBLIC_INCLUDE_DIRS)
foreach(dir ${kiln_include_dirs})
  target_include_directories(kiln_shared PUBLIC $<BUILD_INTERFACE:${dir}>)
endforeach()
# kiln/version.h is generated.
target_include_directories(kiln_shared PUBLIC $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/jit/generated>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# The public headers include <cuda.h> and <nvrtc.h>, nothing else from outside kiln.
target_link_libraries(kiln_shared PUBLIC CUDA::toolkit)
