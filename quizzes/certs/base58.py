"""Base58 with the Bitcoin alphabet (base58btc), the encoding of did:key ids and of eddsa proof values.

Written here because it is twenty lines and the one PyPI package for it has had no release since 2021.
"""

from __future__ import annotations

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    digits = []
    while n:
        n, r = divmod(n, 58)
        digits.append(ALPHABET[r])
    zeros = len(data) - len(data.lstrip(b"\0"))  # each leading zero byte is written as a "1"
    return "1" * zeros + "".join(reversed(digits))


def b58decode(text: str) -> bytes:
    """The bytes of a base58btc string; ValueError on a character outside the alphabet."""
    n = 0
    for c in text:
        try:
            n = n * 58 + _INDEX[c]
        except KeyError:
            raise ValueError(f"invalid base58 character {c!r}") from None
    zeros = len(text) - len(text.lstrip("1"))
    return b"\0" * zeros + (n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b"")
