# Unpacks the golden case v_turbo (a tiny random Z-Image pipeline in the diffusers layout) and the
# real Qwen3 tokenizer into DST/model: the built-in model `zimage generate` uses without --model.
file(REMOVE_RECURSE ${DST})
file(MAKE_DIRECTORY ${DST})
execute_process(COMMAND ${CMAKE_COMMAND} -E tar xzf ${SRC}/tests/data/golden/v_turbo.tar.gz
                WORKING_DIRECTORY ${DST} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cannot unpack v_turbo.tar.gz")
endif()
file(RENAME ${DST}/v_turbo/model ${DST}/model)
file(REMOVE_RECURSE ${DST}/v_turbo)
execute_process(COMMAND gzip -dc ${SRC}/tests/data/qwen3-tokenizer/tokenizer.json.gz
                OUTPUT_FILE ${DST}/model/tokenizer/tokenizer.json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cannot unpack tokenizer.json.gz")
endif()
