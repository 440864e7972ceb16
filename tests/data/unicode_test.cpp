// Code-point classes and UTF-8 decoding (data/unicode.h).
#include <cstdint>
#include <gtest/gtest.h>

#include "data/unicode.h"
#include "data_test_util.h"

namespace zt::data {
namespace {

// Every code point's class equals what node's regex engine says today (the
// committed table was generated from it; a node upgrade that changes Unicode
// data fails here until gen_unicode_classes.mjs is re-run).
TEST(Unicode, ClassesMatchNodeForEveryCodePoint) {
  const test::NodeResult r = test::run_reference("classes", {});
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.out.size(), 1u);
  ASSERT_EQ(r.out[0].size(), 0x110000u);
  int64_t mismatches = 0;
  uint32_t first = 0;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (char_class(cp) != r.out[0][cp]) {
      if (mismatches++ == 0) first = cp;
    }
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch at U+" << std::hex << first << ": table " << int(char_class(first))
                           << ", node " << r.out[0][first] << " (table is Unicode " << unicode_version()
                           << "; regenerate with node src/data/gen_unicode_classes.mjs)";
}

TEST(Unicode, KnownClasses) {
  EXPECT_EQ(char_class('a'), kLetter);
  EXPECT_EQ(char_class('Z'), kLetter);
  EXPECT_EQ(char_class('5'), kNumber);
  EXPECT_EQ(char_class(' '), kSpace);
  EXPECT_EQ(char_class('\t'), kSpace);
  EXPECT_EQ(char_class('\n'), kSpace);
  EXPECT_EQ(char_class(0x0B), kSpace);
  EXPECT_EQ(char_class(0x1F), kOther);    // not \s in JavaScript
  EXPECT_EQ(char_class(0x85), kOther);    // NEL: not \s in JavaScript
  EXPECT_EQ(char_class(0xA0), kSpace);    // NBSP
  EXPECT_EQ(char_class(0xFEFF), kSpace);  // BOM: \s in JavaScript
  EXPECT_EQ(char_class(0x3000), kSpace);
  EXPECT_EQ(char_class(0x4E2D), kLetter);  // 中
  EXPECT_EQ(char_class(0x01C5), kLetter);  // titlecase Dž
  EXPECT_EQ(char_class(0xBD), kNumber);    // ½
  EXPECT_EQ(char_class(0x216B), kNumber);  // Roman numeral twelve
  EXPECT_EQ(char_class(0x0663), kNumber);  // Arabic-Indic three
  EXPECT_EQ(char_class(0x0301), kOther);   // combining acute (Mn)
  EXPECT_EQ(char_class(0x1F999), kOther);  // llama emoji
  EXPECT_EQ(char_class(0x1D518), kLetter);  // mathematical fraktur U
  EXPECT_EQ(char_class(0x20000), kLetter);  // CJK extension B
  EXPECT_EQ(char_class(0xD800), kOther);
  EXPECT_EQ(char_class(0x10FFFF), kOther);
  EXPECT_EQ(char_class(0x110000), kOther);
}

Utf8Char dec(std::string_view s) { return decode_utf8(reinterpret_cast<const unsigned char*>(s.data()), s.size()); }

TEST(Unicode, DecodesValidUtf8) {
  EXPECT_EQ(dec("a").cp, uint32_t('a'));
  EXPECT_EQ(dec("\xc3\xa9").cp, 0xE9u);
  EXPECT_EQ(dec("\xc3\xa9").len, 2);
  EXPECT_EQ(dec("\xe4\xb8\xad").cp, 0x4E2Du);
  EXPECT_EQ(dec("\xe4\xb8\xad").cls, kLetter);
  EXPECT_EQ(dec("\xf0\x9f\xa6\x99").cp, 0x1F999u);
  EXPECT_EQ(dec("\xf0\x9f\xa6\x99").len, 4);
  EXPECT_EQ(dec("\xf4\x8f\xbf\xbf").cp, 0x10FFFFu);
}

// Each byte of an invalid sequence is one character of class "other".
TEST(Unicode, InvalidUtf8IsOneOtherByte) {
  for (std::string_view s : {"\x80", "\xbf", "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80",
                             "\xed\xbf\xbf", "\xf0\x80\x80\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff",
                             "\xe4\xb8", "\xf0\x9f\xa6", "\xc3", "\xc3 ", "\xe4\xb8x"}) {
    const Utf8Char c = dec(s);
    EXPECT_EQ(c.len, 1) << testing::PrintToString(s);
    EXPECT_EQ(c.cls, kOther) << testing::PrintToString(s);
    EXPECT_EQ(c.cp, uint32_t(uint8_t(s[0])));
    EXPECT_FALSE(is_valid_utf8(s.data(), s.size()));
  }
  EXPECT_TRUE(is_valid_utf8("", 0));
  // Long ASCII runs (checked eight bytes at a time) around the bad or good byte.
  for (size_t pre : {0, 7, 8, 9, 20}) {
    for (size_t post : {0, 1, 8, 21}) {
      const std::string bad = std::string(pre, 'a') + "\xff" + std::string(post, 'b');
      EXPECT_FALSE(is_valid_utf8(bad.data(), bad.size())) << pre << " " << post;
      const std::string cut = std::string(pre, 'a') + "\xe4\xb8";
      EXPECT_FALSE(is_valid_utf8(cut.data(), cut.size())) << pre;
      const std::string good = std::string(pre, 'a') + "\xe4\xb8\xad" + std::string(post, 'b');
      EXPECT_TRUE(is_valid_utf8(good.data(), good.size())) << pre << " " << post;
    }
  }
  const std::string ok = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\xa6\x99";
  EXPECT_TRUE(is_valid_utf8(ok.data(), ok.size()));
}

}  // namespace
}  // namespace zt::data
