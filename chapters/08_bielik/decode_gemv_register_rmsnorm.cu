// The register GEMV's forms that normalize their input: gate/up's (kSwiGLU), and kBf16
// and kResidualAdd. decode_gemv_register.cuh lists which file compiles which form.
#include "decode_gemv_register_kernels.cuh"

namespace bielik {
namespace register_gemv {

template void launch<GemvInput::kRmsNorm, GemvOutput::kSwiGLU>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kRmsNorm, GemvOutput::kBf16>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kRmsNorm, GemvOutput::kResidualAdd>(const DecodeGemvParams&, bool, bool, cudaStream_t);

}  // namespace register_gemv
}  // namespace bielik
