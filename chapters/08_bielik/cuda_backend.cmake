# Chapter 08, the CUDA backend: every chapter's kernels assembled into the model, the
# fused decode kernels, the decode CUDA graph; its GPU test and the model benchmark.
# Included at the end of this chapter's CMakeLists.txt (after bielik_ch08 and the tiny
# model golden target exist). Needs chapters 01-05 and 07 in the build (chapter 06 is
# not used: the decode step has its own GEMV with the norm and SwiGLU fused, and prefill
# runs gate|up as one cuBLASLt GEMM + the activation, chapter 06's fastest form there).
set(cuda_backend_dir ${CMAKE_CURRENT_LIST_DIR})
set(cuda_backend_chapters bielik_ch01 bielik_ch02 bielik_ch03 bielik_ch04 bielik_ch05 bielik_ch07)
set(cuda_backend_missing "")
foreach(chapter_lib IN LISTS cuda_backend_chapters)
  if(NOT TARGET ${chapter_lib})
    list(APPEND cuda_backend_missing ${chapter_lib})
  endif()
endforeach()

if(cuda_backend_missing)
  message(STATUS "chapter 08: CUDA backend skipped (not in this build: ${cuda_backend_missing})")
else()
  add_library(bielik_ch08_cuda STATIC
    ${cuda_backend_dir}/model_cuda.cu
    ${cuda_backend_dir}/decode_kernels.cu
    # The register GEMV's forms, a few to a file so that they compile side by side
    # (decode_gemv_register.cuh lists them).
    ${cuda_backend_dir}/decode_gemv_register_plain.cu
    ${cuda_backend_dir}/decode_gemv_register_rmsnorm.cu
    ${cuda_backend_dir}/decode_gemv_register_rmsnorm_qkv_lm_head.cu
    ${cuda_backend_dir}/decode_gemv_register_partials.cu
    ${cuda_backend_dir}/decode_side_prefetch.cu
    ${cuda_backend_dir}/decode_attention_o.cu
    ${cuda_backend_dir}/decode_attention_o_per_head.cu
    ${cuda_backend_dir}/decode_attention_o_blocks.cu
    ${cuda_backend_dir}/sample_kernels.cu
    ${cuda_backend_dir}/prefill_kernels.cu
    ${cuda_backend_dir}/decode_gemv_stream.cu
    ${cuda_backend_dir}/decode_gemv_mma.cu
    ${cuda_backend_dir}/decode_mlp_fused.cu
    ${cuda_backend_dir}/fold_norm_weight.cu
    ${cuda_backend_dir}/decode_step_persistent.cu
    ${cuda_backend_dir}/decode_step_streamed.cu)
  target_include_directories(bielik_ch08_cuda PUBLIC ${cuda_backend_dir})
  target_link_libraries(bielik_ch08_cuda PUBLIC bielik_ch08 ${cuda_backend_chapters})

  # Tiny checkpoints written by the test itself (head_dim 64 and 128, which the attention
  # kernels need), checked against the CPU backend; plus the golden tiny models. The
  # kernels' own cases come first, the model's last (test_model_cuda.cu ends with the
  # persistent step, whose fault would poison every case after it).
  bielik_add_test(test_ch08_model_cuda CHAPTER 08 GPU
                  SOURCES ${cuda_backend_dir}/test_decode_gemv_gpu.cu ${cuda_backend_dir}/test_decode_attention_o_gpu.cu
                          ${cuda_backend_dir}/test_decode_kernels_gpu.cu ${cuda_backend_dir}/test_gpu_sample.cu
                          ${cuda_backend_dir}/test_model_cuda.cu ${cuda_backend_dir}/test_checkpoint_edit.cpp
                  LIBS bielik_ch08_cuda nlohmann_json::nlohmann_json GOLDEN 08_bielik)
  set_tests_properties(test_ch08_model_cuda PROPERTIES TIMEOUT 300)
  # What the backend refuses before it touches the GPU (shapes, options): a CPU test.
  bielik_add_test(test_ch08_model_cuda_refusals CHAPTER 08
                  SOURCES ${cuda_backend_dir}/test_model_cuda_refusals.cu
                  LIBS bielik_ch08_cuda nlohmann_json::nlohmann_json GOLDEN 08_bielik)
  # The decode step's MLP in one kernel (decode_mlp_fused) and the transpose it needs.
  bielik_add_test(test_ch08_mlp_fused CHAPTER 08 GPU SOURCES ${cuda_backend_dir}/test_decode_mlp_fused.cu
                  LIBS bielik_ch08_cuda)

  # bench_model --model DIR [--out build/bench/model.json]
  bielik_add_bench(bench_model SOURCES ${cuda_backend_dir}/bench_model.cu
                   LIBS bielik_ch08_cuda nlohmann_json::nlohmann_json)
  target_compile_definitions(bench_model PRIVATE BIELIK_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

  # bench_decode_gemv: the decode GEMV implementations on Bielik's shapes.
  bielik_add_bench(bench_decode_gemv SOURCES ${cuda_backend_dir}/bench_decode_gemv.cu LIBS bielik_ch08_cuda)
  # bench_fused_mlp: the MLP as gate/up + down against decode_mlp_fused, in a graph chain.
  bielik_add_bench(bench_fused_mlp SOURCES ${cuda_backend_dir}/bench_fused_mlp.cu LIBS bielik_ch08_cuda)
  # bench_kernel_boundary: what a kernel boundary costs, griddepcontrol.wait against a counter.
  bielik_add_bench(bench_kernel_boundary SOURCES ${cuda_backend_dir}/bench_kernel_boundary.cu)
  # bench_layer_chain: the decode step's chain of launches with nothing but their reads, a ceiling.
  bielik_add_bench(bench_layer_chain SOURCES ${cuda_backend_dir}/bench_layer_chain.cu)
  # bench_megakernel: the same bytes and round trips in one persistent kernel with a weight stream that runs ahead.
  bielik_add_bench(bench_megakernel SOURCES ${cuda_backend_dir}/bench_megakernel.cu LIBS bielik_ch08_cuda)
  # The same rows with 16 consumer warps a block instead of 8.
  bielik_add_bench(bench_megakernel_16_warps SOURCES ${cuda_backend_dir}/bench_megakernel.cu LIBS bielik_ch08_cuda)
  target_compile_definitions(bench_megakernel_16_warps PRIVATE BIELIK_MEGAKERNEL_CONSUMER_WARPS=16)
  # bench_read_latency: a dependent read's latency while other SMs, or its own, stream weights.
  bielik_add_bench(bench_read_latency SOURCES ${cuda_backend_dir}/bench_read_latency.cu LIBS bielik_ch08_cuda)
  # bench_l2_prefetch: whether an L2 prefetch lands, and what it is worth to the next read.
  bielik_add_bench(bench_l2_prefetch SOURCES ${cuda_backend_dir}/bench_l2_prefetch.cu LIBS bielik_ch08_cuda)
  # bench_instruction_cache: what cold code (instruction cache misses) costs a kernel in a PDL chain.
  bielik_add_bench(bench_instruction_cache SOURCES ${cuda_backend_dir}/bench_instruction_cache.cu)
  # bench_attention_o: the fused attention + O projection against the kernels it replaces.
  bielik_add_bench(bench_attention_o SOURCES ${cuda_backend_dir}/bench_attention_o.cu LIBS bielik_ch08_cuda)

  # dump_logits: (T, V) logits of a prompt as .npy, for scripts/compare_hf_logits.py.
  add_executable(dump_logits ${cuda_backend_dir}/dump_logits.cpp)
  target_link_libraries(dump_logits PRIVATE bielik_ch08_cuda)
endif()
