# Warnings of project code (libraries, the command line, the tests, the CUDA library).
# TESSERA_WERROR (ON by default) turns them into errors: fix the code, do not exempt it.
option(TESSERA_WERROR "Treat warnings in tessera's own code as errors" ON)

function(tessera_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wno-unused-parameter>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${TESSERA_WERROR}>>:-Werror>
    # nvcc: its own diagnostics, then the host compiler's on the host side of each .cu.
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${TESSERA_WERROR}>>:--Werror=all-warnings;-Xcompiler=-Werror>)
endfunction()
