// The embedded default model's trained weights: models/tiny-brown/weights.safetensors (the compact
// artifact of scripts/train_tiny, docs/tiny_model.md) assembled into the binary's read-only data,
// so that `deepserve` needs no file besides itself. CMake passes the file's absolute path and its
// SHA-256 (the digest changes this file's preprocessed text, so a compiler cache cannot serve an
// object holding an older artifact).
#include "model/embedded_model.h"

#if !defined(DS_EMBEDDED_WEIGHTS_PATH) || !defined(DS_EMBEDDED_WEIGHTS_SHA256)
#error "DS_EMBEDDED_WEIGHTS_PATH and DS_EMBEDDED_WEIGHTS_SHA256 must be defined (src/model/CMakeLists.txt)"
#endif

asm(".section .rodata.ds_embedded_weights,\"a\",@progbits\n"
    ".balign 64\n"
    ".global ds_embedded_weights_begin\n"
    ".hidden ds_embedded_weights_begin\n"
    "ds_embedded_weights_begin:\n"
    ".incbin \"" DS_EMBEDDED_WEIGHTS_PATH "\"\n"
    ".global ds_embedded_weights_end\n"
    ".hidden ds_embedded_weights_end\n"
    "ds_embedded_weights_end:\n"
    ".previous\n");

extern "C" const uint8_t ds_embedded_weights_begin[];
extern "C" const uint8_t ds_embedded_weights_end[];

namespace ds {

std::span<const uint8_t> embedded_weights() {
  return {ds_embedded_weights_begin, size_t(ds_embedded_weights_end - ds_embedded_weights_begin)};
}

const char* embedded_weights_sha256() { return DS_EMBEDDED_WEIGHTS_SHA256; }

}  // namespace ds
