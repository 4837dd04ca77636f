//! FNV-1a 64, the one copy of the hash Weir writes into files and uses to route
//! keys: it must give the same value on every run, platform and version, which
//! std's `Hasher`s do not promise.

/// The FNV-1a 64 offset basis: the hash of no bytes.
pub(crate) const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Continues the FNV-1a 64 hash `hash` over `bytes`.
#[inline]
pub(crate) fn extend(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

/// The FNV-1a 64 hash of `bytes`.
#[inline]
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    extend(OFFSET, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        // From the FNV reference test vectors.
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(extend(hash(b"foo"), b"bar"), hash(b"foobar"));
    }
}
