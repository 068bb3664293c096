// The register GEMV's forms whose input comes in parts: the attention's split partials
// merged by every block (O), or the residual plus a fused kernel's partial sums (gate/up,
// QKV, the lm_head). decode_gemv_register.cuh lists which file compiles which form.
#include "decode_gemv_register_kernels.cuh"

namespace bielik {
namespace register_gemv {

template void launch<GemvInput::kAttentionMerge, GemvOutput::kResidualAdd>(const DecodeGemvParams&, bool, bool,
                                                                           cudaStream_t);
template void launch<GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU>(const DecodeGemvParams&, bool, bool,
                                                                          cudaStream_t);
template void launch<GemvInput::kRmsNormAddPartials, GemvOutput::kRopeAppend>(const DecodeGemvParams&, bool, bool,
                                                                              cudaStream_t);
template void launch<GemvInput::kRmsNormAddPartials, GemvOutput::kF32>(const DecodeGemvParams&, bool, bool,
                                                                       cudaStream_t);

}  // namespace register_gemv
}  // namespace bielik
