/// @file split_batch_rest.hpp
/// @brief When the rest of a decode GEMV's first batch goes out, once the batch is split
/// around the PDL wait (DecodeGemvParams::loads_before_wait, decode_kernels.cuh). Its own
/// header so that the model's options (model_cuda.hpp, read by host-only C++ too) can
/// name it without the kernels' header.
#pragma once

namespace bielik {

/// Each moment asks how a block spends its room for early bytes without filling the
/// memory system's queue while the kernels before it make their dependent reads
/// (chapter 08's README, exercise 32).
enum class SplitBatchRest {
  kAfterStaging,      ///< once the input is staged (the input's reads go first)
  kAfterWait,         ///< right after the wait, ahead of the input's loads
  kWhenFirstArrived,  ///< before the wait, once the loads before it have landed: two half bursts
};

}  // namespace bielik
