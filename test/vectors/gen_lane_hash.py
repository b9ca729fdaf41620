#!/usr/bin/env python3
"""Independent reference for lane_hash.tsv (deliberately not the C++ code).

Run from the repository root:  python3 test/vectors/gen_lane_hash.py > test/vectors/lane_hash.tsv
"""

OFFSET = 14695981039346656037
PRIME = 1099511628211
MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = OFFSET
    for b in data:
        h ^= b
        h = (h * PRIME) & MASK
    return h


KEYS = [
    "",
    "a",
    "b",
    "A",
    "0",
    "order-42",
    "order-43",
    "customer:1",
    "customer:2",
    "tenant/7/order/9001",
    "with space",
    "  leading and trailing  ",
    "ключ",
    "日本",
    "emoji-\U0001F600",
    "caf\u00e9",           # precomposed e-acute
    "cafe\u0301",          # e + combining acute: a different key
    "foobar",
    "x" * 64,
    "0123456789" * 30,     # 300 bytes
]



def main() -> None:
    # Independent check of the arithmetic against the published FNV-1a vectors.
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8
    print("key\tfnv1a64_hex\tlane64")
    for k in KEYS:
        assert "\t" not in k and "\n" not in k and "\r" not in k
        h = fnv1a64(k.encode("utf-8"))
        print(f"{k}\t{h:016x}\t{h % 64}")


if __name__ == "__main__":
    main()
