// UTF-8 validation and repair, written out from the encoding table (RFC 3629, table 3-7
// of the Unicode standard: which second bytes each lead byte allows).
#include "utf8.hpp"

namespace bielik::utf8 {

Scan scan(const std::string& bytes, size_t i) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(bytes[k]); };
  uint8_t lead = byte(i);
  if (lead < 0x80) return {1, true, false};

  // How many continuation bytes follow, and the allowed range of the FIRST one. The
  // narrowed ranges are what rule out overlong forms (E0, F0), surrogates (ED) and
  // code points above U+10FFFF (F4).
  size_t need;
  uint8_t low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {1, false, false};  // 80..C1 (continuation or overlong lead) or F5..FF
  }
  size_t length = 1;
  for (size_t k = 0; k < need; ++k) {
    if (i + length >= bytes.size()) return {length, false, true};
    uint8_t b = byte(i + length);
    if (b < low || b > high) return {length, false, false};
    low = 0x80, high = 0xBF;  // later continuation bytes: the plain range
    ++length;
  }
  return {length, true, false};
}

size_t find_invalid(const std::string& bytes) {
  for (size_t i = 0; i < bytes.size();) {
    Scan s = scan(bytes, i);
    if (!s.valid) return i;
    i += s.length;
  }
  return std::string::npos;
}

std::string invalid_description(const std::string& what, const std::string& bytes) {
  const size_t bad = find_invalid(bytes);
  if (bad == std::string::npos) return "";
  return what + " is not valid UTF-8 at byte " + std::to_string(bad) + " of " + std::to_string(bytes.size());
}

uint32_t decode(const std::string& bytes, size_t i, size_t* length) {
  Scan s = scan(bytes, i);
  *length = s.length;
  uint8_t lead = static_cast<uint8_t>(bytes[i]);
  if (s.length == 1) return lead;
  // Payload bits of the lead byte: 5, 4 or 3 for 2-, 3- and 4-byte forms.
  uint32_t cp = lead & (0x7F >> s.length);
  for (size_t k = 1; k < s.length; ++k) cp = (cp << 6) | (static_cast<uint8_t>(bytes[i + k]) & 0x3F);
  return cp;
}

std::string encode(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string to_valid(const std::string& bytes) {
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    Scan s = scan(bytes, i);
    if (s.valid)
      out.append(bytes, i, s.length);
    else
      out += kReplacement;
    i += s.length;
  }
  return out;
}

size_t complete_prefix(const std::string& bytes) {
  for (size_t i = 0; i < bytes.size();) {
    Scan s = scan(bytes, i);
    if (s.truncated) return i;  // may still become a character: hold it back
    i += s.length;
  }
  return bytes.size();
}

}  // namespace bielik::utf8
