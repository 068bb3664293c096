// The register GEMV's forms for a plain input (x as given): O and down (kResidualAdd)
// and the other outputs the tests and benchmarks ask for. decode_gemv_register.cuh lists
// which file compiles which form.
#include "decode_gemv_register_kernels.cuh"

namespace bielik {
namespace register_gemv {

template void launch<GemvInput::kPlain, GemvOutput::kBf16>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kPlain, GemvOutput::kF32>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kPlain, GemvOutput::kSwiGLU>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kPlain, GemvOutput::kResidualAdd>(const DecodeGemvParams&, bool, bool, cudaStream_t);
template void launch<GemvInput::kPlain, GemvOutput::kRopeAppend>(const DecodeGemvParams&, bool, bool, cudaStream_t);

}  // namespace register_gemv
}  // namespace bielik
