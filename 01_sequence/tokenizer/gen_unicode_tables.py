#!/usr/bin/env python3
"""gen_unicode_tables.py: writes 01_sequence/tokenizer/unicode_tables.{h,cpp} from the Unicode Character Database.

The tokenizer needs a few Unicode properties and nothing else:
  - general category L (letters) and N (numbers), and the White_Space property, for the pre-tokenizer's
    regular expression (\\p{L}, \\p{N}, \\s);
  - canonical decompositions, canonical combining classes, composition exclusions and the NFC quick-check
    property, for NFC normalization (Hangul syllables are left out: the normalizer computes them).

Two Unicode versions, to match Hugging Face tokenizers exactly:
  - the character classes come from the UCD as given (15.0 in Debian 12);
  - the normalization data is cut back to the characters assigned by Unicode 9.0 (DerivedAge.txt),
    because tokenizers' NFC (the crate unicode-normalization-alignments 0.1.12) was generated from
    Unicode 9.0.0: to it, a later character has combining class 0, no decomposition and composes with
    nothing. Normalization data of assigned characters never changes (Unicode's stability policy), so
    the cut gives exactly 9.0's tables.

Input: the UCD text files of Debian's `unicode-data` package (apt-get install -y unicode-data), which puts
them in /usr/share/unicode/. The output is committed; the build never runs this script.

    python3 01_sequence/tokenizer/gen_unicode_tables.py [UCD_DIR]      # from the repository root

Every table is a sorted list of inclusive code point ranges (or of entries keyed by code point), so that
the C++ side can binary-search it and the generated file stays small (under a thousand lines).
"""
import os
import re
import sys

UCD = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
OUT_DIR = os.path.dirname(os.path.abspath(__file__))
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
NORMALIZATION_VERSION = (9, 0)  # see the docstring


def data_lines(name):
    """Yields the fields of each non-comment line of a UCD file, stripped."""
    with open(os.path.join(UCD, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                yield [field.strip() for field in line.split(";")]


def parse_range(text):
    """'0041..005A' or '00AA' -> (first, last)."""
    first, _, last = text.partition("..")
    return int(first, 16), int(last or first, 16)


def unicode_version():
    with open(os.path.join(UCD, "DerivedNormalizationProps.txt"), encoding="utf-8") as f:
        match = re.match(r"# DerivedNormalizationProps-(\d+\.\d+\.\d+)\.txt", f.readline())
    if not match:
        sys.exit("cannot find the Unicode version in DerivedNormalizationProps.txt")
    return match.group(1)


def read_unicode_data():
    """UnicodeData.txt -> {code point: (general category, combining class, decomposition field)}.
    '<..., First>' / '<..., Last>' pairs stand for whole ranges (CJK ideographs, Hangul, ...)."""
    chars = {}
    range_start = None
    for fields in data_lines("UnicodeData.txt"):
        cp, name, category, ccc, decomposition = int(fields[0], 16), fields[1], fields[2], int(fields[3]), fields[5]
        if name.endswith(", First>"):
            range_start = cp
            continue
        if name.endswith(", Last>"):
            for c in range(range_start, cp + 1):
                chars[c] = (category, ccc, "")
            continue
        chars[cp] = (category, ccc, decomposition)
    return chars


def to_ranges(code_points):
    """Sorted code points -> merged inclusive ranges [(first, last)]."""
    ranges = []
    for cp in sorted(code_points):
        if ranges and ranges[-1][1] + 1 == cp:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def property_code_points(file_name, property_name, value=None):
    """Code points listed for `property_name` (with `value` in the third field, when given)."""
    result = set()
    for fields in data_lines(file_name):
        if fields[1] != property_name or (value is not None and fields[2] not in value):
            continue
        first, last = parse_range(fields[0])
        result.update(range(first, last + 1))
    return result


def assigned_by(version):
    """Code points assigned in Unicode `version` (a (major, minor) pair) or earlier, from DerivedAge.txt."""
    result = set()
    for fields in data_lines("DerivedAge.txt"):
        major, minor = (int(x) for x in fields[1].split("."))
        if (major, minor) <= version:
            first, last = parse_range(fields[0])
            result.update(range(first, last + 1))
    return result


def main():
    version = unicode_version()
    chars = read_unicode_data()
    old = assigned_by(NORMALIZATION_VERSION)
    ccc = {cp: c for cp, (_, c, _) in chars.items() if cp in old}

    letters = [cp for cp, (gc, _, _) in chars.items() if gc[0] == "L"]
    numbers = [cp for cp, (gc, _, _) in chars.items() if gc[0] == "N"]
    white_space = property_code_points("PropList.txt", "White_Space")

    # Canonical combining classes, as ranges of equal non-zero class.
    ccc_ranges = []
    for cp in sorted(c for c in ccc if ccc[c] != 0):
        if ccc_ranges and ccc_ranges[-1][1] + 1 == cp and ccc_ranges[-1][2] == ccc[cp]:
            ccc_ranges[-1][1] = cp
        else:
            ccc_ranges.append([cp, cp, ccc[cp]])

    # One level of canonical decomposition (compatibility ones start with '<tag>' and are skipped).
    decompositions = {}
    for cp, (_, _, field) in chars.items():
        if field and not field.startswith("<") and cp in old:
            parts = [int(p, 16) for p in field.split()]
            assert len(parts) in (1, 2), (hex(cp), field)
            decompositions[cp] = parts

    # Full composition exclusion = the script-specific list + singletons + non-starter decompositions
    # (UAX #15). Derive it, then check it against the UCD's own derived list.
    excluded = set()
    for fields in data_lines("CompositionExclusions.txt"):
        excluded.add(int(fields[0], 16))
    excluded &= old
    for cp, parts in decompositions.items():
        if len(parts) == 1 or ccc.get(cp, 0) != 0 or ccc.get(parts[0], 0) != 0:
            excluded.add(cp)
    expected = property_code_points("DerivedNormalizationProps.txt", "Full_Composition_Exclusion") & old
    if excluded != expected:
        sys.exit("derived composition exclusions differ from DerivedNormalizationProps.txt")

    # NFC_QC is No or Maybe: a string without such characters (and without combining marks) is in NFC.
    # (Over 9.0's characters, the later file's set can only be larger: still a safe fast-path test.)
    nfc_not_yes = property_code_points("DerivedNormalizationProps.txt", "NFC_QC", ("N", "M")) & old

    assert not any(HANGUL_FIRST <= cp <= HANGUL_LAST for cp in decompositions)  # done algorithmically
    write_header(version)
    write_source(version, {
        "kLetter": to_ranges(letters),
        "kNumber": to_ranges(numbers),
        "kWhiteSpace": to_ranges(white_space),
        "kNfcQuickCheckNotYes": to_ranges(nfc_not_yes),
        "kCompositionExclusion": to_ranges(excluded),
    }, ccc_ranges, sorted(decompositions.items()))


BANNER = """// GENERATED by 01_sequence/tokenizer/gen_unicode_tables.py from the Unicode Character Database {version}
// (Debian package unicode-data, /usr/share/unicode). Do not edit: change the script and run
//     python3 01_sequence/tokenizer/gen_unicode_tables.py
// Character classes are Unicode {version}'s; normalization data covers the characters assigned by
// Unicode {norm} only, as in Hugging Face tokenizers' NFC (see the script).
"""


def write_header(version):
    text = BANNER.format(version=version, norm="%d.%d.0" % NORMALIZATION_VERSION) + """//
// unicode_tables.h: the Unicode data the tokenizer needs, as sorted tables that unicode.cpp searches.
// Ranges are inclusive [first, last] and sorted by `first`; tables never overlap within themselves.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nanovllm::unicode_tables {

constexpr const char* kUnicodeVersion = "@VERSION@";               // character classes
constexpr const char* kNormalizationUnicodeVersion = "@NORM@";   // NFC data

struct Range {
  uint32_t first, last;
};

// A run of code points with the same non-zero canonical combining class (absent = class 0).
struct CombiningClassRange {
  uint32_t first, last;
  uint8_t combining_class;
};

// One level of canonical decomposition: code_point -> first [second]. second == 0 for singletons.
// Hangul syllables are not listed (they decompose algorithmically).
struct Decomposition {
  uint32_t code_point, first, second;
};

extern const Range kLetter[];                // general category L (Lu Ll Lt Lm Lo): \\p{L}
extern const size_t kLetterCount;
extern const Range kNumber[];                // general category N (Nd Nl No): \\p{N}
extern const size_t kNumberCount;
extern const Range kWhiteSpace[];            // property White_Space: \\s
extern const size_t kWhiteSpaceCount;
extern const Range kNfcQuickCheckNotYes[];   // NFC_Quick_Check = No or Maybe
extern const size_t kNfcQuickCheckNotYesCount;
extern const Range kCompositionExclusion[];  // Full_Composition_Exclusion: never produced by composition
extern const size_t kCompositionExclusionCount;
extern const CombiningClassRange kCombiningClass[];
extern const size_t kCombiningClassCount;
extern const Decomposition kDecomposition[];  // sorted by code_point
extern const size_t kDecompositionCount;

}  // namespace nanovllm::unicode_tables
""".replace("@VERSION@", version).replace("@NORM@", "%d.%d.0" % NORMALIZATION_VERSION)
    with open(os.path.join(OUT_DIR, "unicode_tables.h"), "w", encoding="utf-8") as f:
        f.write(text)


def wrap(items, per_line):
    lines = []
    for i in range(0, len(items), per_line):
        lines.append("    " + " ".join(items[i:i + per_line]))
    return "\n".join(lines)


def write_source(version, range_tables, ccc_ranges, decompositions):
    out = [BANNER.format(version=version, norm="%d.%d.0" % NORMALIZATION_VERSION), '#include "01_sequence/tokenizer/unicode_tables.h"\n',
           "namespace nanovllm::unicode_tables {\n"]
    for name, ranges in range_tables.items():
        items = ["{0x%X, 0x%X}," % (a, b) for a, b in ranges]
        out.append("const Range %s[] = {\n%s\n};" % (name, wrap(items, 6)))
        out.append("const size_t %sCount = sizeof %s / sizeof %s[0];\n" % (name, name, name))
    items = ["{0x%X, 0x%X, %d}," % (a, b, c) for a, b, c in ccc_ranges]
    out.append("const CombiningClassRange kCombiningClass[] = {\n%s\n};" % wrap(items, 5))
    out.append("const size_t kCombiningClassCount = sizeof kCombiningClass / sizeof kCombiningClass[0];\n")
    items = ["{0x%X, 0x%X, 0x%X}," % (cp, parts[0], parts[1] if len(parts) > 1 else 0)
             for cp, parts in decompositions]
    out.append("const Decomposition kDecomposition[] = {\n%s\n};" % wrap(items, 4))
    out.append("const size_t kDecompositionCount = sizeof kDecomposition / sizeof kDecomposition[0];\n")
    out.append("}  // namespace nanovllm::unicode_tables\n")
    with open(os.path.join(OUT_DIR, "unicode_tables.cpp"), "w", encoding="utf-8") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
