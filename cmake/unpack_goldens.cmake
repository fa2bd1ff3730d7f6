# Unpacks every tests/data/golden/*.tar.gz into DST/<case>/ and restores the tokenizer.json the
# archives leave out (it is the published Qwen3 one, kept once in tests/data/qwen3-tokenizer).
file(GLOB archives ${SRC}/tests/data/golden/*.tar.gz)
file(MAKE_DIRECTORY ${DST})
foreach(a ${archives})
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar xzf ${a} WORKING_DIRECTORY ${DST} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cannot unpack ${a}")
  endif()
endforeach()
# Image-to-image / inpainting cases and the image reader's files (tools/make_image_goldens.py)
# go to DST/image/<case>/: they hold no model (each names a case above), and the text-to-image
# tests, which glob DST/*, never see them.
file(GLOB image_archives ${SRC}/tests/data/golden/image/*.tar.gz)
file(MAKE_DIRECTORY ${DST}/image)
foreach(a ${image_archives})
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar xzf ${a} WORKING_DIRECTORY ${DST}/image
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cannot unpack ${a}")
  endif()
endforeach()
# ControlNet cases (tools/make_controlnet_goldens.py) go to DST/controlnet/<case>/: the tiny
# 30-layer transformer (cn_model) and one case per ControlNet version; they reuse v_turbo's other
# components.
file(GLOB controlnet_archives ${SRC}/tests/data/golden/controlnet/*.tar.gz)
file(MAKE_DIRECTORY ${DST}/controlnet)
foreach(a ${controlnet_archives})
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar xzf ${a} WORKING_DIRECTORY ${DST}/controlnet
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cannot unpack ${a}")
  endif()
endforeach()
file(GLOB tokdirs ${DST}/*/model/tokenizer)
foreach(t ${tokdirs})
  execute_process(COMMAND gzip -dc ${SRC}/tests/data/qwen3-tokenizer/tokenizer.json.gz
                  OUTPUT_FILE ${t}/tokenizer.json RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cannot restore tokenizer.json into ${t}")
  endif()
endforeach()
file(TOUCH ${DST}/.stamp)
