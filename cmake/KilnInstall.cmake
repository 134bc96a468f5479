# `cmake --install` produces a package that another project uses with find_package(kiln) (kiln::kiln) or, with
# KILN_SHARED, pkg-config (kiln.pc).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(KILN_SHARED)
  install(TARGETS kiln_shared EXPORT kilnTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  # Relocatable: the prefix is found from where the .pc file is (libdir/pkgconfig, libdir may be lib/<triplet>).
  string(REGEX REPLACE "[^/]+" ".." KILN_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/kiln.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kiln.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
else()
  get_property(kiln_libs GLOBAL PROPERTY KILN_LIBRARIES)
  install(TARGETS ${kiln_libs} kiln_static EXPORT kilnTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# Only each room's include/ folder: internal headers live in its src/ and are never installed.
get_property(kiln_include_dirs GLOBAL PROPERTY KILN_PUBLIC_INCLUDE_DIRS)
foreach(dir ${kiln_include_dirs})
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
install(FILES ${PROJECT_SOURCE_DIR}/cmake/Findxxhash.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kilnConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kilnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kilnConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/kilnConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
