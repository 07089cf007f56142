/* SPDX-License-Identifier: MIT */
/*
 * text.c — text from elsewhere (a server's words, a host name) made safe
 * to keep and to show on a terminal: valid UTF-8 without control bytes,
 * cut to fit with a mark (refusal.c says what it is kept for).
 */
#include "internal.h"

/* Length of the well-formed UTF-8 sequence at p (at most n bytes), and
 * its code point; 0 when the bytes there are not one (overlong forms,
 * surrogates and values past U+10FFFF included). */
static size_t utf8_seq(const unsigned char *p, size_t n, uint32_t *cp) {
  unsigned c = p[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf)
    len = 2, v = c & 0x1f, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, v = c & 0x0f, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, v = c & 0x07, min = 0x10000;
  else
    return 0;
  if (len > n)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80)
      return 0;
    v = (v << 6) | (p[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
    return 0;
  *cp = v;
  return len;
}

/* Would this code point move a terminal's cursor or change what follows:
 * C0, DEL, C1, and the bidirectional embeddings, overrides and isolates. */
static bool unsafe_cp(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

size_t throttle__clean_text(char *dst, size_t size, const char *src,
                            size_t len) {
  static const char cut[] = "...";
  if (size == 0)
    return 0;
  size_t n = 0;
  const unsigned char *p = (const unsigned char *)src;
  size_t i = 0;
  while (src != NULL && i < len) {
    uint32_t cp;
    size_t l = utf8_seq(p + i, len - i, &cp);
    const char *put = (const char *)p + i;
    size_t plen = l;
    if (l == 0) { /* not UTF-8: one byte, shown as '?' */
      put = "?";
      plen = 1;
      l = 1;
    } else if (unsafe_cp(cp)) { /* a line break or a control: a space */
      put = " ";
      plen = 1;
    }
    /* Room for this sequence, and for the mark of a cut if more follows. */
    size_t need = plen + (i + l < len ? sizeof cut - 1 : 0);
    if (n + need > size - 1) {
      if (n + (sizeof cut - 1) > size - 1) /* a tiny buffer: no mark */
        break;
      memcpy(dst + n, cut, sizeof cut - 1);
      n += sizeof cut - 1;
      break;
    }
    memcpy(dst + n, put, plen);
    n += plen;
    i += l;
  }
  dst[n] = 0;
  return n;
}
