// UTF-8 helpers for the tokenizer: lossy conversion of raw token bytes to text (each maximal
// ill-formed subpart becomes one U+FFFD, the Unicode "best practice" that Rust's
// String::from_utf8_lossy and WHATWG decoders follow), and the split point between the complete
// characters of a byte buffer and an incomplete trailing sequence that later bytes may finish.
// Streaming and one-shot decoding share these functions so their outputs agree byte for byte.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ds::tok {

// Appends `bytes` to `out`, replacing every maximal ill-formed subpart with U+FFFD.
void append_utf8_lossy(std::string_view bytes, std::string* out);

// Length of the longest prefix of `bytes` that can be emitted now: everything except a trailing
// sequence that is a valid but incomplete start of a character (at most 3 bytes). Bytes that no
// continuation can make valid are included (they become U+FFFD when converted).
size_t utf8_emittable_prefix(std::string_view bytes);

// Length in bytes of the character starting at `s[0]` when it is well-formed, else 0.
size_t utf8_char_len(std::string_view s);

}  // namespace ds::tok
