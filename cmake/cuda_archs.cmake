# zimage_select_cuda_archs(MODE OUT_VAR): the CMAKE_CUDA_ARCHITECTURES for ZIMAGE_CUDA_ARCHS=MODE
# (see CMakeLists.txt). "auto" asks nvidia-smi (ZIMAGE_NVIDIA_SMI, else the one on PATH) for the
# compute capability of every GPU of this machine; tests/cmake/test_cuda_archs.cmake runs it
# against stand-ins for nvidia-smi.
set(ZIMAGE_PORTABLE_CUDA_ARCHS "80-real;89-real;90a-real;100-real;120-real;120-virtual")

function(zimage_select_cuda_archs mode out_var)
  if(mode STREQUAL "portable")
    set(${out_var} "${ZIMAGE_PORTABLE_CUDA_ARCHS}" PARENT_SCOPE)
    return()
  endif()
  if(NOT mode STREQUAL "auto")
    set(${out_var} "${mode}" PARENT_SCOPE)  # an explicit list
    return()
  endif()
  set(archs "${ZIMAGE_PORTABLE_CUDA_ARCHS}")
  if(NOT ZIMAGE_NVIDIA_SMI)
    find_program(ZIMAGE_NVIDIA_SMI nvidia-smi)
  endif()
  if(ZIMAGE_NVIDIA_SMI)
    execute_process(COMMAND ${ZIMAGE_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 20)
    string(REPLACE "\n" ";" caps "${caps}")
    set(local "")
    set(usable ON)
    foreach(cap IN LISTS caps)
      string(STRIP "${cap}" cap)
      if(NOT cap MATCHES "^([0-9]+)\\.([0-9]+)$")
        set(usable OFF)  # "[N/A]", an error text: do not guess
        continue()
      endif()
      set(sm "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      if(sm LESS 80)
        set(usable OFF)  # zimage needs sm_80 or newer; a portable build still serves the others
      elseif(sm EQUAL 90)
        list(APPEND local "90a-real")  # Hopper's wgmma/TMA kernels need sm_90a
      else()
        list(APPEND local "${sm}-real")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES local)
    if(rc EQUAL 0 AND usable AND local)
      set(archs "${local}")
      message(STATUS "zimage: CUDA code for this machine's GPU(s): ${archs} "
                     "(-DZIMAGE_CUDA_ARCHS=portable builds for every supported GPU)")
    endif()
  endif()
  set(${out_var} "${archs}" PARENT_SCOPE)
endfunction()
