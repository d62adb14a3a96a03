# FindNCCL: NVIDIA's collective communication library (stage 10, ring attention).
#
# Searches, in order: NCCL_ROOT (a CMake or environment variable: NCCL's
# prefix, e.g. a pip wheel's site-packages/nvidia/nccl), the CUDA toolkit's
# include/ and lib64/ (where the CUDA toolkit's NCCL puts it, as on the CI
# machine), then the system's own include and library folders
# (/usr/include/nccl.h and /usr/lib/x86_64-linux-gnu/libnccl.so from the
# libnccl-dev package, as on the GPU machines).
#
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION
# (major.minor.patch, from nccl.h) and the imported target NCCL::NCCL.
# find_package(NCCL [version]) fails the version check for an older NCCL.

# The CUDA toolkit's folders, when the project found it (CUDAToolkit).
set(_nccl_hint_include "")
set(_nccl_hint_lib "")
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_hint_include ${CUDAToolkit_INCLUDE_DIRS})
endif()
if(CUDAToolkit_LIBRARY_DIR)
  list(APPEND _nccl_hint_lib ${CUDAToolkit_LIBRARY_DIR})
endif()

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${_nccl_hint_include}
  PATH_SUFFIXES include)
# A pip wheel ships libnccl.so.2 alone, without the libnccl.so link.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${_nccl_hint_lib}
  PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${part} +([0-9]+).*" "\\1" _nccl_${part}
           "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
