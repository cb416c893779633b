//! Prices as decimals: the integer `m` and scale `k` of a price that is
//! the f64 nearest to `m / 10^k`, for the two blob codecs
//! ([`crate::rowcodec`], [`crate::tickblock`]).
//!
//! Prices are decimals in practice (a market's tick size is 0.01 or
//! 0.001), and an f64's bits hide that: eight bytes of noisy mantissa that
//! zstd cannot fold, where `m` takes a varint of a byte or two. The same
//! idea as the floating-point compression of the columnar anchors
//! (DuckDB's ALP). Nothing is assumed: a price is a decimal at `k` only if
//! `m / 10^k`, computed as [`value`] computes it, gives back its bits, so
//! -0.0, NaN, infinities and prices of more than [`MAX_SCALE`] places are
//! not, and their codecs keep the bits.

/// The largest scale tried: `10^15` is the largest power of ten an f64
/// holds exactly.
pub(crate) const MAX_SCALE: u8 = 15;

/// `10^k` for every scale: exact, so encoder and decoder divide by the
/// same number.
const POW10: [f64; MAX_SCALE as usize + 1] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

/// `m` stays within this: every such integer is an exact f64.
const MAX_MANTISSA: f64 = (1u64 << 53) as f64;

/// The `m` with [`value`]`(m, k)` equal to `p` bit for bit, if any.
pub(crate) fn mantissa(p: f64, k: u8) -> Option<i64> {
    let x = p * POW10[k as usize];
    if x.is_nan() || x.abs() > MAX_MANTISSA {
        return None;
    }
    let m = hindsight_schemas::num::round(x);
    (value(m, k).to_bits() == p.to_bits()).then_some(m)
}

/// The price of mantissa `m` at scale `k` (at most [`MAX_SCALE`]).
pub(crate) fn value(m: i64, k: u8) -> f64 {
    m as f64 / POW10[k as usize]
}

/// The least scale at which every one of `prices` is a decimal, if one is
/// at most [`MAX_SCALE`].
///
/// One pass, raising the scale at each price that needs more, then a
/// second over only the prices before the last raise: a price found at
/// a smaller scale is, in practice, one at the final scale too, but the
/// codecs must round-trip, so it is checked. Those after the last raise
/// were found at the final scale already. (`scale` was about a tenth of
/// the head merger's samples on the long tail, `perf`.)
pub(crate) fn scale(prices: impl Iterator<Item = f64> + Clone) -> Option<u8> {
    let mut k = 0;
    let mut raised_at = 0;
    for (i, p) in prices.clone().enumerate() {
        if mantissa(p, k).is_some() {
            continue;
        }
        loop {
            k += 1;
            if k > MAX_SCALE {
                return None;
            }
            if mantissa(p, k).is_some() {
                break;
            }
        }
        raised_at = i;
    }
    prices
        .take(raised_at)
        .all(|p| mantissa(p, k).is_some())
        .then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_found_at_their_least_scale_and_others_are_not() {
        for (prices, want) in [
            (vec![0.5, 0.25, 0.125], Some(3)),
            (vec![0.001, 0.999, 0.5], Some(3)),
            (vec![0.01, 0.02, 0.97], Some(2)),
            (vec![1.0, 2.0, -3.0], Some(0)),
            (vec![0.1 + 0.2, 0.5], None),
            (vec![0.5, -0.0], None),
            (vec![0.5, f64::NAN], None),
            (vec![f64::INFINITY], None),
            (vec![1e300], None),
            (vec![1.0 / 3.0], None),
            // 2^53 is a decimal at scale 0 only (at 1 its mantissa is too
            // large), and 0.5 needs 1: found before the raise, it is
            // checked again.
            (vec![9_007_199_254_740_992.0, 0.5], None),
            (vec![0.5, 9_007_199_254_740_992.0], None),
        ] {
            let k = scale(prices.iter().copied());
            assert_eq!(k, want, "{prices:?}");
            if let Some(k) = k {
                for p in prices {
                    let m = mantissa(p, k).unwrap();
                    assert_eq!(value(m, k).to_bits(), p.to_bits());
                }
            }
        }
    }

    /// The scale as it was found before prices after the last raise were
    /// spared their second check: every price checked again at the end.
    fn scale_checking_every_price_twice(prices: &[f64]) -> Option<u8> {
        let mut k = 0;
        for &p in prices {
            while mantissa(p, k).is_none() {
                k += 1;
                if k > MAX_SCALE {
                    return None;
                }
            }
        }
        prices
            .iter()
            .all(|&p| mantissa(p, k).is_some())
            .then_some(k)
    }

    /// The second pass over part of the prices finds what the one over
    /// all of them found: random lists of decimals at random scales, with
    /// now and then a price of no decimal form or one too large for the
    /// larger scales, at random places.
    #[test]
    fn checking_only_the_prices_before_the_last_raise_finds_the_same_scale() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut found = [0usize; MAX_SCALE as usize + 2];
        for _ in 0..20_000 {
            let n = 1 + (next() % 12) as usize;
            let prices: Vec<f64> = (0..n)
                .map(|_| match next() % 20 {
                    0 => 1.0 / 3.0,
                    1 => 9_007_199_254_740_992.0,
                    2 => -0.0,
                    _ => {
                        let k = (next() % 7) as u8;
                        value((next() % 100_000) as i64 - 50_000, k)
                    }
                })
                .collect();
            let want = scale_checking_every_price_twice(&prices);
            assert_eq!(scale(prices.iter().copied()), want, "{prices:?}");
            found[want.map_or(MAX_SCALE as usize + 1, usize::from)] += 1;
        }
        // Both outcomes come up often enough to be compared.
        assert!(found[MAX_SCALE as usize + 1] > 1_000, "{found:?}");
        assert!(
            found[..=6].iter().filter(|&&n| n > 100).count() >= 5,
            "{found:?}"
        );
    }
}
