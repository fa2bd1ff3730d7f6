# Finds what the Python module needs: a Python interpreter with its development headers and
# nanobind. Sets ZIMAGE_HAVE_PYTHON, or ZIMAGE_PYTHON_MISSING to the reason (ZIMAGE_PYTHON=ON makes
# that an error). Under `pip install .` scikit-build-core chose the interpreter (SKBUILD); in a
# plain build the one scripts/setup_python.sh made in third_party/python is preferred (it sees
# Debian's numpy / Pillow / pytest and has nanobind), else whatever FindPython finds.
if(NOT DEFINED SKBUILD AND NOT DEFINED Python_EXECUTABLE
   AND EXISTS ${CMAKE_SOURCE_DIR}/third_party/python/bin/python3)
  set(Python_EXECUTABLE ${CMAKE_SOURCE_DIR}/third_party/python/bin/python3)
endif()
set(ZIMAGE_PYTHON_MISSING "")
find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
if(NOT Python_FOUND)
  set(ZIMAGE_PYTHON_MISSING "no Python 3.9+ interpreter with development headers (python3-dev)")
else()
  execute_process(COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
                  OUTPUT_VARIABLE ZIMAGE_NANOBIND_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE nb_rc ERROR_QUIET)
  if(nb_rc EQUAL 0)
    find_package(nanobind CONFIG HINTS ${ZIMAGE_NANOBIND_DIR})
  endif()
  if(NOT nanobind_FOUND)
    set(ZIMAGE_PYTHON_MISSING "nanobind is not installed for ${Python_EXECUTABLE}")
  endif()
endif()
if(ZIMAGE_PYTHON_MISSING STREQUAL "")
  set(ZIMAGE_HAVE_PYTHON ON)
  message(STATUS "zimage: Python module ON (${Python_EXECUTABLE}, nanobind ${nanobind_VERSION})")
elseif(ZIMAGE_PYTHON STREQUAL "ON")
  message(FATAL_ERROR "ZIMAGE_PYTHON=ON: ${ZIMAGE_PYTHON_MISSING}")
else()
  message(STATUS "zimage: Python module OFF: ${ZIMAGE_PYTHON_MISSING}")
endif()
