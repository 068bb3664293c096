# One way to declare each kind of target, so every chapter's CMakeLists.txt reads alike.

# bielik_add_golden(<chapter> <script> [DEPENDS extra files...])
# Runs golden/<script> with BIELIK_PYTHON to write .npy cases into
# ${BIELIK_GOLDEN_DIR}/<chapter>/; reruns when the script or golden_common.py changes.
function(bielik_add_golden chapter script)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  set(out_dir "${BIELIK_GOLDEN_DIR}/${chapter}")
  set(stamp "${out_dir}/.stamp")
  add_custom_command(
    OUTPUT "${stamp}"
    COMMAND ${CMAKE_COMMAND} -E make_directory "${out_dir}"
    COMMAND ${BIELIK_PYTHON} "${CMAKE_SOURCE_DIR}/golden/${script}" --out "${out_dir}"
    COMMAND ${CMAKE_COMMAND} -E touch "${stamp}"
    DEPENDS "${CMAKE_SOURCE_DIR}/golden/${script}" "${CMAKE_SOURCE_DIR}/golden/golden_common.py" ${ARG_DEPENDS}
    COMMENT "golden: ${script} -> ${out_dir}"
    VERBATIM)
  add_custom_target(golden_${chapter} ALL DEPENDS "${stamp}")
  add_dependencies(golden golden_${chapter})
endfunction()

# bielik_add_test(<name> CHAPTER <NN> SOURCES ... [LIBS ...] [GPU] [GOLDEN <chapter>...])
# A Catch2 executable registered with ctest and labelled chNN (plus "gpu" or "cpu").
# GPU tests link the GPU test main, which exits 77 when no CUDA device is present;
# ctest reports that as "skipped" (SKIP_RETURN_CODE), never as passed. CPU tests have no
# skip code: they always run, so any nonzero exit of theirs is a failure.
function(bielik_add_test name)
  cmake_parse_arguments(ARG "GPU" "CHAPTER" "SOURCES;LIBS;GOLDEN" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  if(ARG_GPU)
    target_link_libraries(${name} PRIVATE bielik_test_main_gpu ${ARG_LIBS})
    set(kind gpu)
  else()
    target_link_libraries(${name} PRIVATE bielik_test_main_cpu ${ARG_LIBS})
    set(kind cpu)
    set_property(GLOBAL APPEND PROPERTY BIELIK_CPU_TEST_TARGETS ${name})  # the `cpu_tests` target
  endif()
  foreach(golden IN LISTS ARG_GOLDEN)
    add_dependencies(${name} golden_${golden})
  endforeach()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "ch${ARG_CHAPTER};${kind}")
  if(ARG_GPU)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()

# bielik_add_bench(<name> SOURCES ... [LIBS ...])
# A benchmark program (never a test): `make bench` runs every bench_* on a GPU machine.
function(bielik_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE bielik_common ${ARG_LIBS})
  set_property(GLOBAL APPEND PROPERTY BIELIK_BENCHES ${name})
endfunction()
