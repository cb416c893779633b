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
    let m = (p * POW10[k as usize]).round();
    (m.abs() <= MAX_MANTISSA && value(m as i64, k).to_bits() == p.to_bits()).then_some(m as i64)
}

/// The price of mantissa `m` at scale `k` (at most [`MAX_SCALE`]).
pub(crate) fn value(m: i64, k: u8) -> f64 {
    m as f64 / POW10[k as usize]
}

/// The least scale at which every one of `prices` is a decimal, if one is
/// at most [`MAX_SCALE`].
pub(crate) fn scale(prices: impl Iterator<Item = f64> + Clone) -> Option<u8> {
    let mut k = 0;
    for p in prices.clone() {
        while mantissa(p, k).is_none() {
            k += 1;
            if k > MAX_SCALE {
                return None;
            }
        }
    }
    // A price found at a smaller scale is, in practice, one at `k` too;
    // checked, since the codecs must round-trip.
    prices
        .into_iter()
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
}
