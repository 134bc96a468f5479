# kiln_library(NAME folder SOURCES ...): one static library per folder, exported as kiln::<folder>. Its
# include/ folder holds its public headers (installed); anything internal stays in its src/.
function(kiln_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  add_library(kiln_${name} STATIC ${ARG_SOURCES})
  add_library(kiln::${name} ALIAS kiln_${name})
  set_target_properties(kiln_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME kiln_${name})
  target_include_directories(kiln_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_options(kiln_${name} PRIVATE -Wall -Wextra -Wno-missing-field-initializers)
  set_property(GLOBAL APPEND PROPERTY KILN_LIBRARIES kiln_${name})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    set_property(GLOBAL APPEND PROPERTY KILN_PUBLIC_INCLUDE_DIRS ${CMAKE_CURRENT_SOURCE_DIR}/include)
  endif()
endfunction()

# kiln_room(name [PUBLIC deps...] [PRIVATE deps...]): kiln_library of every src/*.cpp of the calling folder,
# linked as given, its src/ (internal headers) seen by itself only.
function(kiln_room name)
  cmake_parse_arguments(ARG "" "" "PUBLIC;PRIVATE" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
  kiln_library(${name} SOURCES ${sources})
  target_link_libraries(kiln_${name} PUBLIC ${ARG_PUBLIC} PRIVATE ${ARG_PRIVATE})
  target_include_directories(kiln_${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endfunction()

# kiln_embed(TARGET target NAMESPACE ns FILES f1 f2 ...): builds text files into the target as a table
# (name -> contents), so that the runtime never reads the source tree. The generated function is
#   std::span<const kiln::EmbeddedFile> <ns>::embedded_files();
function(kiln_embed)
  cmake_parse_arguments(ARG "" "TARGET;NAMESPACE;BASE" "FILES" ${ARGN})
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${ARG_TARGET}_embedded.cpp")
  set(files_abs "")
  foreach(f ${ARG_FILES})
    get_filename_component(abs "${f}" ABSOLUTE)
    list(APPEND files_abs "${abs}")
  endforeach()
  add_custom_command(OUTPUT "${out}"
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} -DNAMESPACE=${ARG_NAMESPACE} -DBASE=${ARG_BASE}
            "-DFILES=${files_abs}" -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/KilnEmbedScript.cmake
    DEPENDS ${files_abs} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/KilnEmbedScript.cmake
    COMMENT "Embedding ${ARG_NAMESPACE} files" VERBATIM)
  target_sources(${ARG_TARGET} PRIVATE "${out}")
endfunction()
