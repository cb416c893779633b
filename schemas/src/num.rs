//! Number helpers the hot paths share.

/// `x.round() as i64` (half away from zero, saturating, NaN to 0) without
/// `f64::round`: on the baseline x86-64 the release is built for (no
/// SSE4.1), that is a call into a software `round`, a third of finding a
/// price's decimal form and about 1 % of a long-tail backfill's CPU
/// (`perf`). Truncation is one instruction, and below 2^52 `x` less its
/// truncation is exact, so rounding half away from zero gives the same
/// integer; from 2^52 on every `f64` is an integer already.
pub fn round(x: f64) -> i64 {
    if x.is_nan() || x.abs() >= (1u64 << 52) as f64 {
        return x as i64;
    }
    let t = x as i64;
    let fraction = x - t as f64;
    if fraction >= 0.5 {
        t + 1
    } else if fraction <= -0.5 {
        t - 1
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f64::round`'s integer, halves included, over every `f64`.
    #[test]
    fn rounding_is_f64_rounding() {
        const MAX: f64 = (1u64 << 53) as f64;
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut xs = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            0.49999999999999994,
        ];
        xs.extend([
            MAX,
            -MAX,
            MAX / 4.0 + 0.5,
            -(MAX / 4.0) - 0.5,
            MAX / 2.0 - 0.5,
        ]);
        xs.extend([1e300, -1e300, f64::INFINITY, f64::NEG_INFINITY, f64::NAN]);
        for _ in 0..200_000 {
            let x = f64::from_bits(next());
            xs.push(x);
            let x = x % MAX;
            if x.is_finite() {
                xs.push(x);
                xs.push(x.trunc() + 0.5f64.copysign(x));
            }
            let scale = 10f64.powi((next() % 16) as i32);
            xs.push((next() % 2_000_001) as f64 / scale - 1_000.0);
            xs.push((next() % 4_102_444_800_000) as f64 / 1000.0 * 1000.0);
        }
        for x in xs {
            assert_eq!(round(x), x.round() as i64, "{x:e}");
        }
    }
}
