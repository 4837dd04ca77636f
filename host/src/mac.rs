//! HMAC-SHA256 under a 32-byte key, the keyed hash of the compiled-plugin cache's MACs and of
//! the seeds of plugins' random numbers.
//!
//! Why it exists: `Mac::new_from_slice` returns a `Result` that HMAC never uses (it takes keys
//! of any length). Keying it with the block-sized form of the key is the same HMAC (a key
//! shorter than the block is zero-padded by definition) with no error path on the host.

use hmac::Hmac;
use hmac::digest::{Key, KeyInit};
use sha2::Sha256;

/// HMAC-SHA256 keyed with `key`, ready to `update`.
pub(crate) fn hmac_sha256(key: &[u8; 32]) -> Hmac<Sha256> {
    let mut block = Key::<Hmac<Sha256>>::default();
    block[..key.len()].copy_from_slice(key);
    <Hmac<Sha256> as KeyInit>::new(&block)
}

#[cfg(test)]
mod tests {
    use hmac::Mac;

    use super::*;

    #[test]
    fn the_block_sized_key_is_the_same_hmac_as_the_short_one() {
        let key = [0x0bu8; 32];
        let mut ours = hmac_sha256(&key);
        ours.update(b"Hi There");
        let mut reference =
            <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("HMAC takes any key length");
        reference.update(b"Hi There");
        assert_eq!(
            ours.finalize().into_bytes(),
            reference.finalize().into_bytes()
        );
    }

    #[test]
    fn matches_an_independent_implementation() {
        // Python: hmac.new(bytes(range(1, 33)), b"what do ya want for nothing?",
        // "sha256").hexdigest() (the message of RFC 4231 test case 2, under a 32-byte key).
        let key: [u8; 32] = std::array::from_fn(|i| u8::try_from(i + 1).unwrap_or(0));
        let mut mac = hmac_sha256(&key);
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "4d9d653fcd05f91cd858a20d50c74b604fe38f2cac49d9b0a7099584cf4fb35a"
        );
    }
}
