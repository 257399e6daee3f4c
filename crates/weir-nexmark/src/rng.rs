//! `java.util.Random`'s linear congruential generator, bit for bit, so the generated
//! stream can be checked against Java implementations of Nexmark.

const MULTIPLIER: u64 = 0x5_DEEC_E66D;
const ADDEND: u64 = 0xB;
const MASK: u64 = (1 << 48) - 1;

/// The 48-bit LCG of `java.util.Random`: the same seed gives the same draws as Java.
///
/// ```
/// use weir_nexmark::JavaRandom;
/// let mut r = JavaRandom::new(0);
/// assert_eq!(r.next_i32(), -1155484576);
/// assert_eq!(JavaRandom::new(1000).below_i32(13), 4);
/// ```
#[derive(Debug, Clone)]
pub struct JavaRandom {
    state: u64,
}

impl JavaRandom {
    /// A generator seeded as `new java.util.Random(seed)`.
    pub fn new(seed: i64) -> Self {
        JavaRandom {
            state: (seed as u64 ^ MULTIPLIER) & MASK,
        }
    }

    /// The next `bits` (1..=32) random bits, as Java's `next(bits)`.
    #[inline]
    pub fn next_bits(&mut self, bits: u32) -> i32 {
        self.state = self.state.wrapping_mul(MULTIPLIER).wrapping_add(ADDEND) & MASK;
        (self.state >> (48 - bits)) as u32 as i32
    }

    /// A uniform `i32` (`nextInt()`).
    #[inline]
    pub fn next_i32(&mut self) -> i32 {
        self.next_bits(32)
    }

    /// A uniform integer in `0..n` (`nextInt(n)`), for `n > 0`.
    #[inline]
    pub fn below_i32(&mut self, n: i32) -> i32 {
        debug_assert!(n > 0, "bound must be positive");
        if n & n.wrapping_neg() == n {
            return ((i64::from(n) * i64::from(self.next_bits(31))) >> 31) as i32;
        }
        loop {
            let bits = self.next_bits(31);
            let val = bits % n;
            if bits.wrapping_sub(val).wrapping_add(n - 1) >= 0 {
                return val;
            }
        }
    }

    /// A uniform `i64` (`nextLong()`).
    #[inline]
    pub fn next_i64(&mut self) -> i64 {
        let hi = i64::from(self.next_bits(32)) << 32;
        hi.wrapping_add(i64::from(self.next_bits(32)))
    }

    /// A uniform `f64` in `[0, 1)` (`nextDouble()`).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        let hi = i64::from(self.next_bits(26)) << 27;
        (hi + i64::from(self.next_bits(27))) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// An integer in `0..n` as Nexmark draws longs: `nextInt(n)` when `n` fits an `i32`,
    /// otherwise `|nextLong() % n|`.
    #[inline]
    pub fn below_i64(&mut self, n: i64) -> i64 {
        if n < i64::from(i32::MAX) {
            i64::from(self.below_i32(n as i32))
        } else {
            (self.next_i64() % n).abs()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_jdk_test_vectors() {
        let mut r = JavaRandom::new(0);
        assert_eq!(
            [r.next_i32(), r.next_i32(), r.next_i32()],
            [-1155484576, -723955400, 1033096058]
        );
        assert_eq!(JavaRandom::new(0).next_i64(), -4962768465676381896);
        assert_eq!(JavaRandom::new(0).next_f64(), 0.730967787376657);
        let mut r = JavaRandom::new(1000);
        let v: Vec<i32> = (0..5).map(|_| r.below_i32(13)).collect();
        assert_eq!(v, vec![4, 10, 3, 1, 0]);
        let mut r = JavaRandom::new(-7);
        assert_eq!(
            [r.below_i32(1_000_000_007), r.below_i32(1_000_000_007)],
            [577934662, 935951290]
        );
    }
}
