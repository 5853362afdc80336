// The GPT-2 "bytes to unicode" alphabet that byte-level BPE vocabularies are written in: every
// byte value maps to one printable code point (printable Latin-1 bytes to themselves, the rest to
// U+0100 and up), so vocabulary strings can hold arbitrary bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ds::tok {

// Code point that stands for byte `b`.
uint32_t byte_to_codepoint(uint8_t b);
// The byte a code point stands for, if it is part of the alphabet.
std::optional<uint8_t> codepoint_to_byte(uint32_t cp);
// Decodes a vocabulary string written in the alphabet into raw bytes; nullopt when the string
// holds a character outside the alphabet (such entries can only be reached as added tokens).
std::optional<std::string> byte_level_to_bytes(std::string_view vocab_string);
// Encodes raw bytes into the alphabet (the inverse of byte_level_to_bytes).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace ds::tok
