# Every dependency comes from a Debian package through find_package; nothing is downloaded or vendored.
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  message(FATAL_ERROR
    "kiln needs the CUDA toolkit (NVRTC, cuBLAS, NCCL headers and libraries), and none was found.\n"
    "Install CUDA 12.8 or newer (https://developer.nvidia.com/cuda-downloads) so that /usr/local/cuda exists, "
    "or point CMake at it with -DCUDAToolkit_ROOT=/path/to/cuda. No GPU or driver is needed to build.")
endif()
if(CUDAToolkit_VERSION VERSION_LESS 12.8)
  message(FATAL_ERROR "kiln needs CUDA 12.8 or newer (NVRTC precompiled headers); found ${CUDAToolkit_VERSION}")
endif()

# kiln dlopens the driver (libcuda.so.1) itself and must never link it: CMake's CUDA::nvrtc drags in
# CUDA::cuda_driver (the toolkit's stub libcuda), which sanitizer links would record as needed, so binaries
# would not start on machines without a driver. Drop that edge.
set_property(TARGET CUDA::nvrtc PROPERTY INTERFACE_LINK_LIBRARIES "")
add_link_options(LINKER:--as-needed)

find_package(Threads REQUIRED)
find_package(TBB REQUIRED)
find_package(RocksDB REQUIRED)
find_package(xxhash REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
# hiredis (libhiredis-dev) ships no CMake package: found through pkg-config.
find_package(PkgConfig REQUIRED)
pkg_check_modules(hiredis REQUIRED IMPORTED_TARGET hiredis)
if(KILN_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(KILN_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

# The toolkit's include directory is where NVRTC finds cuda_fp16.h and friends at run time.
list(GET CUDAToolkit_INCLUDE_DIRS 0 KILN_CUDA_INCLUDE_DIR)
