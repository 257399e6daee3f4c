//! `java.util.Random`'s linear congruential generator, bit for bit.

const MULTIPLIER: u64 = 0x5_DEEC_E66D;
const ADDEND: u64 = 0xB;
const MASK: u64 = (1 << 48) - 1;

/// The 48-bit LCG of `java.util.Random`.
///
/// Every draw matches the JDK's method of the same meaning (`next`, `nextInt()`,
/// `nextInt(n)`, `nextLong()`, `nextDouble()`), so a stream drawn from it can be checked
/// bit for bit against Java.
///
/// ```
/// use weir_nexmark::JavaRandom;
/// // `new java.util.Random(0).nextInt()` three times:
/// let mut r = JavaRandom::new(0);
/// assert_eq!(r.next_i32(), -1155484576);
/// assert_eq!(r.next_i32(), -723955400);
/// assert_eq!(r.next_i32(), 1033096058);
/// // `new java.util.Random(1000).nextInt(13)`:
/// assert_eq!(JavaRandom::new(1000).below_i32(13), 4);
/// ```
#[derive(Debug, Clone)]
pub struct JavaRandom {
    seed: u64,
}

impl JavaRandom {
    /// A generator seeded like `new java.util.Random(seed)`: the state is
    /// `(seed XOR 0x5DEECE66D) mod 2^48`, on the seed's two's-complement bits.
    #[inline]
    pub fn new(seed: i64) -> Self {
        JavaRandom {
            seed: (seed as u64 ^ MULTIPLIER) & MASK,
        }
    }

    /// Java's `next(bits)`: advances the state and returns its top `bits` bits
    /// (1 ≤ `bits` ≤ 32). For 32 bits the result is reinterpreted as a signed `i32`.
    #[inline]
    pub fn next_bits(&mut self, bits: u32) -> i32 {
        debug_assert!((1..=32).contains(&bits));
        self.seed = self.seed.wrapping_mul(MULTIPLIER).wrapping_add(ADDEND) & MASK;
        (self.seed >> (48 - bits)) as u32 as i32
    }

    /// Java's `nextInt()`: 32 random bits as an `i32`.
    #[inline]
    pub fn next_i32(&mut self) -> i32 {
        self.next_bits(32)
    }

    /// Java's `nextInt(n)`: uniform on `0..n`, with Java's power-of-two shortcut and its
    /// rejection of the top, biased range.
    ///
    /// # Panics
    /// In debug builds, if `n <= 0`.
    #[inline]
    pub fn below_i32(&mut self, n: i32) -> i32 {
        debug_assert!(n > 0, "bound must be positive");
        let mut r = self.next_bits(31);
        if n & (n - 1) == 0 {
            return ((n as i64 * r as i64) >> 31) as i32;
        }
        let m = n - 1;
        let mut u = r;
        loop {
            r = u % n;
            // Java: `u - r + m < 0` with wrapping, i.e. the sum overflows an i32.
            if u.wrapping_sub(r).wrapping_add(m) >= 0 {
                return r;
            }
            u = self.next_bits(31);
        }
    }

    /// Java's `nextLong()`: `(next(32) << 32) + next(32)`, wrapping, with the second half
    /// sign-extended.
    #[inline]
    pub fn next_i64(&mut self) -> i64 {
        let hi = (self.next_bits(32) as i64) << 32;
        hi.wrapping_add(self.next_bits(32) as i64)
    }

    /// Java's `nextDouble()`: uniform on `[0, 1)` with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        let hi = (self.next_bits(26) as i64) << 27;
        let bits = hi + self.next_bits(27) as i64;
        bits as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Nexmark's `nextLong(random, n)`: `nextInt(n)` if `n < 2^31 − 1`, else
    /// `|nextLong() % n|`.
    ///
    /// # Panics
    /// In debug builds, if `n <= 0`.
    #[inline]
    pub fn below_i64(&mut self, n: i64) -> i64 {
        if n < i32::MAX as i64 {
            self.below_i32(n as i32) as i64
        } else {
            (self.next_i64() % n).wrapping_abs()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::JavaRandom;

    #[test]
    fn int32_seed_0() {
        let mut r = JavaRandom::new(0);
        assert_eq!(
            [r.next_i32(), r.next_i32(), r.next_i32()],
            [-1155484576, -723955400, 1033096058]
        );
    }

    #[test]
    fn int64_seed_0() {
        assert_eq!(JavaRandom::new(0).next_i64(), -4962768465676381896);
    }

    #[test]
    fn unit_f64_seed_0() {
        assert_eq!(JavaRandom::new(0).next_f64(), 0.730967787376657);
    }

    #[test]
    fn int_below_13_seed_1000() {
        let mut r = JavaRandom::new(1000);
        let got: Vec<i32> = (0..5).map(|_| r.below_i32(13)).collect();
        assert_eq!(got, [4, 10, 3, 1, 0]);
    }

    #[test]
    fn int_below_large_seed_minus_7() {
        let mut r = JavaRandom::new(-7);
        assert_eq!(
            [r.below_i32(1_000_000_007), r.below_i32(1_000_000_007)],
            [577934662, 935951290]
        );
    }

    #[test]
    fn below_i64_small_bound_is_int_below() {
        let mut a = JavaRandom::new(1000);
        let mut b = JavaRandom::new(1000);
        for n in [1i64, 2, 13, 111, 1010, 10_000] {
            assert_eq!(a.below_i64(n), b.below_i32(n as i32) as i64);
        }
    }

    #[test]
    fn below_i64_large_bound_in_range() {
        let mut r = JavaRandom::new(42);
        for _ in 0..1000 {
            let v = r.below_i64(i64::MAX / 3);
            assert!((0..i64::MAX / 3).contains(&v));
        }
    }

    #[test]
    fn power_of_two_bound() {
        let mut r = JavaRandom::new(7);
        for _ in 0..1000 {
            assert!((0..16).contains(&r.below_i32(16)));
        }
    }
}
