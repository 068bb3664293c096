// The register GEMV's forms that normalize their input for QKV (kRopeAppend) and the
// lm_head (kF32). decode_gemv_register.cuh lists which file compiles which form.
#include "decode_gemv_register_kernels.cuh"

namespace bielik {
namespace register_gemv {

template void launch<GemvInput::kRmsNorm, GemvOutput::kRopeAppend>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kRmsNorm, GemvOutput::kF32>(const DecodeGemvParams&, bool, bool, cudaStream_t);

}  // namespace register_gemv
}  // namespace bielik
