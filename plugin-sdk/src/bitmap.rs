//! Arrow's bit-packed layout (least significant bit first), used for validity and
//! for boolean values and row masks, so that they cross the boundary as bytes
//! without re-packing.

/// A fixed number of bits, packed least significant bit first into bytes.
///
/// Bits past `len` in the last byte are always zero.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Bitmap {
    bytes: Vec<u8>,
    len: usize,
}

impl Bitmap {
    /// `len` bits, all zero.
    pub fn new_zeroed(len: usize) -> Self {
        Self {
            bytes: vec![0; len.div_ceil(8)],
            len,
        }
    }

    /// `len` bits, all one.
    pub fn new_set(len: usize) -> Self {
        let mut bitmap = Self {
            bytes: vec![0xff; len.div_ceil(8)],
            len,
        };
        bitmap.clear_tail();
        bitmap
    }

    /// `len` bits where bit `i` is `f(i)`.
    ///
    /// This is the tight per-row loop for building masks: eight calls fill one byte.
    pub fn from_fn(len: usize, mut f: impl FnMut(usize) -> bool) -> Self {
        let mut bytes = Vec::with_capacity(len.div_ceil(8));
        let full = len / 8;
        for chunk in 0..full {
            let base = chunk * 8;
            let mut byte = 0u8;
            for bit in 0..8 {
                byte |= u8::from(f(base + bit)) << bit;
            }
            bytes.push(byte);
        }
        let rest = len % 8;
        if rest != 0 {
            let base = full * 8;
            let mut byte = 0u8;
            for bit in 0..rest {
                byte |= u8::from(f(base + bit)) << bit;
            }
            bytes.push(byte);
        }
        Self { bytes, len }
    }

    /// The first `len` bits of `bytes` (Arrow's layout). Extra bytes are dropped and bits past `len`
    /// cleared; missing bytes read as zero.
    pub fn from_bytes(mut bytes: Vec<u8>, len: usize) -> Self {
        bytes.resize(len.div_ceil(8), 0);
        let mut bitmap = Self { bytes, len };
        bitmap.clear_tail();
        bitmap
    }

    /// A bitmap of `bools`.
    pub fn from_bools(bools: &[bool]) -> Self {
        Self::from_fn(bools.len(), |i| bools[i])
    }

    fn clear_tail(&mut self) {
        let rest = self.len % 8;
        if rest != 0
            && let Some(last) = self.bytes.last_mut()
        {
            *last &= (1u8 << rest) - 1;
        }
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bit `i`; false when `i` is out of range.
    #[inline]
    pub fn get(&self, i: usize) -> bool {
        i < self.len && self.bytes[i / 8] & (1 << (i % 8)) != 0
    }

    /// Sets bit `i` to `value`; does nothing when `i` is out of range.
    #[inline]
    pub fn set(&mut self, i: usize, value: bool) {
        if i < self.len {
            let mask = 1u8 << (i % 8);
            if value {
                self.bytes[i / 8] |= mask;
            } else {
                self.bytes[i / 8] &= !mask;
            }
        }
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> usize {
        self.bytes.iter().map(|b| b.count_ones() as usize).sum()
    }

    /// The packed bytes (`len.div_ceil(8)` of them).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The packed bytes, consuming the bitmap.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Bitwise AND with `other`, over the shorter length.
    #[must_use]
    pub fn and(&self, other: &Bitmap) -> Bitmap {
        let len = self.len.min(other.len);
        let bytes = self
            .bytes
            .iter()
            .zip(&other.bytes)
            .map(|(a, b)| a & b)
            .collect();
        Bitmap::from_bytes(bytes, len)
    }

    /// Iterates the bits in order.
    pub fn iter(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.len).map(move |i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_fn_packs_lsb_first_and_clears_the_tail() {
        let b = Bitmap::from_fn(11, |i| i % 3 == 0);
        assert_eq!(b.as_bytes(), &[0b0100_1001, 0b0000_0010]);
        assert_eq!(b.count_ones(), 4);
        assert!(b.get(9));
        assert!(!b.get(10));
        assert!(!b.get(11));
        let all = Bitmap::new_set(11);
        assert_eq!(all.as_bytes(), &[0xff, 0b0000_0111]);
        assert_eq!(all.count_ones(), 11);
    }

    #[test]
    fn from_bytes_resizes_and_masks() {
        let b = Bitmap::from_bytes(vec![0xff, 0xff, 0xff], 10);
        assert_eq!(b.as_bytes(), &[0xff, 0b11]);
        let short = Bitmap::from_bytes(vec![], 3);
        assert_eq!(short.as_bytes(), &[0]);
    }

    #[test]
    fn set_and_and() {
        let mut a = Bitmap::new_zeroed(9);
        a.set(8, true);
        a.set(2, true);
        a.set(2, false);
        a.set(100, true);
        assert_eq!(a.iter().filter(|b| *b).count(), 1);
        let b = Bitmap::new_set(9);
        assert_eq!(a.and(&b), a);
    }
}
