"""Writes lib/tokenizer/tok_unicode_compat.c: where our Unicode tables (utf8proc's and
PCRE2's) and Hugging Face tokenizers' differ, and how we follow tokenizers.

1. Normalization: the code points whose Unicode normalization differs between utf8proc
(current Unicode tables) and tokenizers (whose normalization crate carries older tables).
Two kinds: characters utf8proc knows as combining marks (canonical combining class > 0)
that tokenizers treats as starters (class 0), and characters that one of NFC, NFD, NFKC,
NFKD decomposes differently. Our normalizer passes them through unchanged and lets them
block reordering, as tokenizers does.

2. Regex classes: the code points that tokenizers' regex engine (Oniguruma, newer Unicode
tables) puts in a general category (\p{L}, \p{Nd}, ...) or in \d, and the system's PCRE2
does not (or the reverse). tok_regex.c rewrites each such class of a pattern to add them
(or take them out), so that splitting follows tokenizers. Found by matching every code
point with both engines: PCRE2 through the library the build links, Oniguruma through
tokenizers' Split pre-tokenizer.

Run with the conformance venv:

    .venv/bin/python scripts/gen-unicode-compat.py > lib/tokenizer/tok_unicode_compat.c
"""

import ctypes
import sys

import tokenizers
from tokenizers import Regex, normalizers, pre_tokenizers

lib = ctypes.CDLL("libutf8proc.so.2")
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]


class Prop(ctypes.Structure):
    _fields_ = [("category", ctypes.c_int16), ("combining_class", ctypes.c_int16)]


lib.utf8proc_get_property.restype = ctypes.POINTER(Prop)
lib.utf8proc_version.restype = ctypes.c_char_p
lib.utf8proc_unicode_version.restype = ctypes.c_char_p
FORMS = ["NFC", "NFD", "NFKC", "NFKD"]
for f in FORMS:
    getattr(lib, "utf8proc_" + f).restype = ctypes.c_void_p
    getattr(lib, "utf8proc_" + f).argtypes = [ctypes.c_char_p]
hf = {f: getattr(normalizers, f)() for f in FORMS}


def ours(form, s):
    p = getattr(lib, "utf8proc_" + form)(s.encode())
    r = ctypes.string_at(p).decode()
    libc.free(p)
    return r


opaque = set()
for cp in range(1, 0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    if any(hf[f].normalize_str(c) != ours(f, c) for f in FORMS):
        opaque.add(cp)
        continue
    k = lib.utf8proc_get_property(cp).contents.combining_class
    if k == 0:
        continue
    # a mark of a lower class moves before U+0345 (class 240); a higher one after U+0334 (1)
    s = "a\u0345" + c if k < 240 else "a" + c + "\u0334"
    if hf["NFD"].normalize_str(s) == s:
        opaque.add(cp)

# ---- 2. regex classes ----
CATEGORIES = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
              "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
              "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Co", "Cn"]
pcre = ctypes.CDLL("libpcre2-8.so.0")
pcre.pcre2_compile_8.restype = ctypes.c_void_p
pcre.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
                                 ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t),
                                 ctypes.c_void_p]
pcre.pcre2_match_data_create_8.restype = ctypes.c_void_p
pcre.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
pcre.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                               ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
pcre.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
pcre.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
pcre.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
PCRE2_UTF, PCRE2_UCP, PCRE2_CONFIG_UNICODE_VERSION, PCRE2_CONFIG_VERSION = 0x80000, 0x20000, 10, 11

ALL = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
TEXT = "".join(map(chr, ALL))
UTF8 = TEXT.encode()
INDEX = {}  # byte offset -> index into ALL
pos = 0
for i, ch in enumerate(TEXT):
    INDEX[pos] = i
    pos += len(ch.encode())
INDEX[pos] = len(ALL)


def pcre_set(cls):
    """The code points PCRE2 (UTF, UCP, as tok_regex.c compiles) matches with cls."""
    ec, eo = ctypes.c_int(), ctypes.c_size_t()
    re = pcre.pcre2_compile_8(f"(?:{cls})+".encode(), len(cls) + 5, PCRE2_UTF | PCRE2_UCP,
                              ctypes.byref(ec), ctypes.byref(eo), None)
    assert re, cls
    md = pcre.pcre2_match_data_create_8(4, None)
    got, at = set(), 0
    while pcre.pcre2_match_8(re, UTF8, len(UTF8), at, 0, md, None) >= 0:
        ov = pcre.pcre2_get_ovector_pointer_8(md)
        got.update(ALL[INDEX[ov[0]]:INDEX[ov[1]]])
        at = ov[1]
    return got


def onig_set(cls):
    """The code points tokenizers' regex engine matches with cls: what Split removes."""
    split = pre_tokenizers.Split(Regex(f"(?:{cls})+"), behavior="removed")
    kept = set()
    for _, (a, b) in split.pre_tokenize_str(TEXT):
        kept.update(ALL[a:b])
    return set(ALL) - kept


def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    # C string text of PCRE2 class members: \\x{1C89}-\\x{1C8A}...
    return "".join(f"\\\\x{{{a:X}}}" + (f"-\\\\x{{{b:X}}}" if b > a else "") for a, b in out)


classes = []
for name, cls in [(c, f"\\p{{{c}}}") for c in CATEGORIES] + [("d", "\\d")]:
    p, o = pcre_set(cls), onig_set(cls)
    if p != o:
        classes.append((name, ranges(o - p), ranges(p - o)))

buf = ctypes.create_string_buffer(64)
pcre.pcre2_config_8(PCRE2_CONFIG_VERSION, buf)
pcre_version = buf.value.decode()
pcre.pcre2_config_8(PCRE2_CONFIG_UNICODE_VERSION, buf)
pcre_unicode = buf.value.decode()

cps = sorted(opaque)
out = sys.stdout
out.write(f"""/* Generated by scripts/gen-unicode-compat.py (utf8proc {lib.utf8proc_version().decode()},
 * Unicode {lib.utf8proc_unicode_version().decode()}; PCRE2 {pcre_version}, Unicode {pcre_unicode}; tokenizers {tokenizers.__version__}):
 * do not edit.
 * Code points whose normalization differs between utf8proc and Hugging Face tokenizers;
 * the normalizer passes them through unchanged, as starters. */
#include <string.h>

#include "tokenizer/tok_internal.h"

static const uint32_t opaque[] = {{
""")
for i in range(0, len(cps), 8):
    out.write("    " + ", ".join(f"0x{c:05X}" for c in cps[i:i + 8]) + ",\n")
out.write("""};

bool tk_unicode_opaque(uint32_t cp)
{
    size_t lo = 0, hi = sizeof opaque / sizeof *opaque;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (opaque[mid] == cp)
            return true;
        if (opaque[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}
""")
out.write("""
/* Regex classes whose code points differ between PCRE2 and tokenizers' Oniguruma: name
 * (a general category, or "d" for \\d), what Oniguruma adds, what it takes out (as
 * PCRE2 class members). */
static const tk_uclass classes[] = {
""")


def c_string(members):
    """members as C string literals of at most ~90 columns, one per line."""
    parts, line = [], ""
    for item in members.replace("\\\\x", "\n\\\\x").split("\n")[1:]:
        if len(line) + len(item) > 84:
            parts.append(line)
            line = ""
        line += item
    parts.append(line)
    return "\n".join(f'     "{p}"' for p in parts)


for name, add, rem in classes:
    out.write(f'    {{"{name}",\n{c_string(add)},\n{c_string(rem)}}},\n')
out.write("""};

const tk_uclass *tk_unicode_class(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof classes / sizeof *classes; i++)
        if (strlen(classes[i].name) == len && !memcmp(classes[i].name, name, len))
            return &classes[i];
    return NULL;
}
""")
