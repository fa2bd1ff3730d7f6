cmake_minimum_required(VERSION 3.25)
# ZIMAGE_CUDA_ARCHS (cmake/cuda_archs.cmake) against stand-ins for nvidia-smi: one Hopper, a mix
# of GPUs, an old GPU, an error, no GPU; and the explicit modes. Run by ctest (CudaArchsSelection):
#   cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -P tests/cmake/test_cuda_archs.cmake
include(${SOURCE_DIR}/cmake/cuda_archs.cmake)
file(MAKE_DIRECTORY ${WORK_DIR})
set(failures 0)

function(expect mode smi_output smi_rc expected)
  set(fake ${WORK_DIR}/nvidia-smi-${smi_rc})
  string(MAKE_C_IDENTIFIER "${smi_output}" tag)
  set(fake "${fake}-${tag}")
  file(WRITE ${fake} "#!/bin/sh\nprintf '${smi_output}'\nexit ${smi_rc}\n")
  file(CHMOD ${fake} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  set(ZIMAGE_NVIDIA_SMI ${fake})
  zimage_select_cuda_archs("${mode}" got)
  if(NOT got STREQUAL "${expected}")
    message(SEND_ERROR "mode ${mode}, nvidia-smi '${smi_output}' (exit ${smi_rc}): got '${got}', "
                       "expected '${expected}'")
  endif()
endfunction()

set(all_archs "${ZIMAGE_PORTABLE_CUDA_ARCHS}")
expect(auto "9.0\\n" 0 "90a-real")
expect(auto "12.0\\n12.0\\n" 0 "120-real")
expect(auto "8.6\\n9.0\\n10.0\\n" 0 "86-real;90a-real;100-real")
expect(auto "8.9\\n" 0 "89-real")
expect(auto "7.5\\n" 0 "${all_archs}")           # too old for zimage: a portable build
expect(auto "8.0\\n7.0\\n" 0 "${all_archs}")
expect(auto "[N/A]\\n" 0 "${all_archs}")         # an unreadable answer is not guessed at
expect(auto "" 9 "${all_archs}")                 # no GPU / driver: nvidia-smi fails
expect(auto "" 0 "${all_archs}")
expect(portable "9.0\\n" 0 "${all_archs}")
expect("90a-real;120-real" "8.0\\n" 0 "90a-real;120-real")
