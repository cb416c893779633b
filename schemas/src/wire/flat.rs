//! The wire's common case read without serde: a flat object of strings
//! and numbers, as every price tick, trade and metrics sample is.
//!
//! Why: reading a long-tail price line through `serde_json` and the
//! derive for [`WireLine`] cost ~415 ns (183 ns this way), ~15 % of a
//! `backfill --project`'s samples under `perf`. The derive matches each key
//! against WireLine's thirty fields and copies through a generic visitor;
//! this reads the five or six keys a tick has straight into their slots.
//!
//! It reads only what it can read exactly as `serde_json` would, and
//! declines (`None`) everything else — escapes, nested values, `null`,
//! keys it does not take, a key given twice, a value of a type the field
//! does not take, bad syntax — for `serde_json` to read or explain. So a
//! line means the same whichever path reads it, and every reject is still
//! worded by one place; `tests::the_fast_path_reads_as_serde_does` holds
//! the two to that.

use super::{unix_seconds, Text, WireLine, WireTs};
use crate::time::Timestamp;

/// Reads `line` into `w` (empty), when it is a flat object this module
/// reads; on `None`, `w` holds whatever was read before it declined. The
/// line is read into the caller's `w` rather than returned: a `WireLine`
/// is most of a kilobyte, and moving it out was a tenth of the time.
pub(super) fn scan<'a>(line: &'a str, w: &mut WireLine<'a>) -> Option<()> {
    let mut at = Cursor { line, i: 0 };
    at.byte(b'{')?;
    if at.peek() == Some(b'}') {
        at.i += 1;
    } else {
        loop {
            let key = at.string()?;
            at.byte(b':')?;
            at.value_of(key, w)?;
            match at.next_byte()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    // Nothing but whitespace may follow (serde: "trailing characters").
    at.skip_ws();
    (at.i == line.len()).then_some(())
}

struct Cursor<'a> {
    line: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.line.as_bytes()
    }

    /// JSON's whitespace: space, tab, line feed, carriage return.
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte past whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.bytes().get(self.i).copied()
    }

    fn next_byte(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        Some(b)
    }

    fn byte(&mut self, want: u8) -> Option<()> {
        (self.next_byte()? == want).then_some(())
    }

    /// A string without escapes or control characters (JSON allows
    /// neither raw), borrowed from the line.
    fn string(&mut self) -> Option<&'a str> {
        self.byte(b'"')?;
        let rest = &self.bytes()[self.i..];
        let len = string_end(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        // Both ends are ASCII quotes, so the slice is on char boundaries.
        let s = &self.line[self.i..self.i + len];
        self.i += len + 1;
        Some(s)
    }

    /// A number's text, by JSON's grammar:
    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let b = self.bytes();
        let start = self.i;
        let mut i = start;
        let digits = |i: &mut usize| {
            let from = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > from
        };
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return None,
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !digits(&mut i) {
                return None;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            if !digits(&mut i) {
                return None;
            }
        }
        self.i = i;
        Some(&self.line[start..i])
    }

    /// A number as an `f64`. `serde_json` (with `float_roundtrip`) rounds
    /// every number text to the nearest `f64`, as `str::parse` does; it
    /// refuses one too large to be finite, so that is left to it.
    fn float(&mut self) -> Option<f64> {
        let v: f64 = self.number()?.parse().ok()?;
        v.is_finite().then_some(v)
    }

    /// Reads the value of `key` into its slot of `w`.
    fn value_of(&mut self, key: &str, w: &mut WireLine<'a>) -> Option<()> {
        match key {
            "kind" => once(&mut w.kind, Text(self.string()?.into())),
            "market_id" => once(&mut w.market_id, self.string()?.to_owned()),
            "token_id" => once(&mut w.token_id, self.string()?.to_owned()),
            "side" => once(&mut w.side, self.string()?.to_owned()),
            "trade_id" => once(&mut w.trade_id, self.string()?.to_owned()),
            "p" => once(&mut w.p, self.float()?),
            "price" => once(&mut w.price, self.float()?),
            "size" => once(&mut w.size, self.float()?),
            "volume" => once(&mut w.volume, self.float()?),
            "liquidity" => once(&mut w.liquidity, self.float()?),
            "spread" => once(&mut w.spread, self.float()?),
            "ts" => {
                // As [`WireTs`] reads it: Unix seconds, or text.
                let ts = if self.peek()? == b'"' {
                    Timestamp::parse(self.string()?).ok()?
                } else {
                    unix_seconds(self.float()?).ok()?
                };
                once(&mut w.ts, WireTs(ts))
            }
            _ => None,
        }
    }
}

/// The index of the first byte of `rest` that ends or interrupts a string
/// without escapes: a quote, a backslash or a control character.
///
/// Eight bytes at a time while eight remain (a byte at a time was a
/// seventh of validating a tick): each test below sets a byte's high bit
/// where it holds, exactly at the first byte that matches and maybe
/// wrongly above it (a borrow), so the lowest bit set is the answer.
fn string_end(rest: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // `x - n·ONES & !x & HIGH`: the bytes of x below n (n ≤ 0x80).
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * n as u64) & !x & HIGH;
    let mut at = 0;
    while let Some(chunk) = rest.get(at..at + 8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let hits = below(x ^ (ONES * b'"' as u64), 1)
            | below(x ^ (ONES * b'\\' as u64), 1)
            | below(x, 0x20);
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    rest[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|i| at + i)
}

/// Fills an empty slot; a second value for it is `serde_json`'s
/// "duplicate field" error, so declined.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(value);
            Some(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse_line_with, read_with_serde, validate, Limits};
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    const NOW: Timestamp = Timestamp(1_760_000_000_000);

    fn pick(items: &[&'static str]) -> BoxedStrategy<String> {
        prop::sample::select(items.to_vec())
            .prop_map(String::from)
            .boxed()
    }

    /// Values a line may hold: every JSON type, strings with and without
    /// escapes, and numbers in every form JSON allows and some it does not.
    fn value() -> BoxedStrategy<String> {
        prop_oneof![
            pick(&[
                r#""price""#,
                r#""trade""#,
                r#""metrics""#,
                r#""book""#,
                r#""nope""#,
                r#""m1""#,
                r#""lt13-yes""#,
                r#""""#,
                r#"" ""#,
                r#""a\"b""#,
                r#""\u00e9""#,
                r#""é""#,
                "\"x\ty\"",
                r#""buy""#,
                r#""sell""#,
                r#""2025-09-01T00:00:00Z""#,
                r#""1756771199""#,
                r#""not a time""#,
            ]),
            pick(&[
                "0",
                "-0",
                "0.5",
                "1",
                "1.0",
                "1e0",
                "1E+0",
                "5e-1",
                "01",
                "1.",
                "-",
                ".5",
                "+1",
                "1e400",
                "-1e400",
                "1e-400",
                "18446744073709551616",
                "-9223372036854775809",
                "1756771199",
                "1756771199.999",
                "2e9",
                "-2e9",
                "0.30000000000000004",
                "1_0",
                "0x1",
                "NaN",
                "Infinity",
                "1e",
                "1e+",
            ]),
            any::<f64>().prop_map(|v| format!("{v}")),
            any::<f64>().prop_map(|v| format!("{v:e}")),
            (0.0..=1.0f64).prop_map(|v| format!("{v}")),
            (946_684_800i64..4_102_444_800).prop_map(|v| v.to_string()),
            "[0-9]{1,25}(\\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?",
            pick(&["null", "true", "[1]", "[]", r#"{"a":1}"#, r#"[[0.5,1]]"#]),
        ]
        .boxed()
    }

    fn key() -> BoxedStrategy<String> {
        prop_oneof![
            3 => pick(&[
                "kind", "market_id", "token_id", "ts", "p", "price", "size", "side",
                "trade_id", "volume", "liquidity", "spread",
            ]),
            1 => pick(&["id", "bids", "extra", r"k\u0069nd", "p ", ""]),
        ]
        .prop_map(|k| format!("\"{k}\""))
        .boxed()
    }

    fn ws() -> BoxedStrategy<String> {
        prop_oneof![4 => Just(String::new()), 1 => pick(&[" ", "\t", "\n ", "\r", "\u{a0}"])]
            .boxed()
    }

    /// A line: a price, trade or metrics line's fields in any order, some
    /// dropped, others added, whitespace anywhere, and now and then broken
    /// syntax around them.
    fn line() -> impl Strategy<Value = String> {
        let tick = pick(&[
            r#""kind":"price","market_id":"m1","token_id":"lt13-yes","ts":1756771199,"p":0.324"#,
            r#""kind":"trade","market_id":"m1","token_id":"t","ts":"2025-09-01T00:00:00Z","price":0.5,"size":10,"side":"buy","trade_id":"x1""#,
            r#""kind":"metrics","market_id":"m1","ts":1756771199.5,"volume":1e3,"liquidity":0,"spread":0.01"#,
            r#""kind":"price","market_id":"m\"1","token_id":"t","ts":1756771199,"p":-0"#,
            r#""kind":"price","market_id":"m1","token_id":"lt13-y\u0065s","ts":1756771199,"p":0"#,
        ]);
        let extra = prop::collection::vec((key(), ws(), value(), ws()), 0..3);
        let broken = pick(&["", "", "", "", "", "x", ",", "}", "{", "\"", " "]);
        (
            tick,
            extra,
            ws(),
            broken,
            any::<prop::sample::Index>(),
            any::<u8>(),
        )
            .prop_map(|(tick, extra, pad, broken, cut, drop)| {
                let mut fields: Vec<String> = tick.split(',').map(String::from).collect();
                // Drop one field now and then, move one to the end.
                if drop % 4 == 0 {
                    fields.remove(drop as usize % fields.len());
                }
                let moved = fields.remove(cut.index(fields.len()));
                fields.push(moved);
                for (k, w1, v, w2) in extra {
                    fields.insert(
                        cut.index(fields.len() + 1),
                        format!("{w1}{k}{w1}:{w2}{v}{w2}"),
                    );
                }
                let body = format!("{pad}{{{}}}{pad}{broken}", fields.join(&format!("{pad},")));
                if broken == "{" {
                    body.chars().take(body.chars().count() / 2).collect()
                } else {
                    body
                }
            })
    }

    /// Whatever the line, both paths give the same event, or the same
    /// reject: the fast path only reads what `serde_json` reads, and
    /// declines the rest. (Debug output compares floats bit for bit,
    /// `-0.0` included.)
    #[test]
    fn the_fast_path_reads_as_serde_does() {
        let limits = Limits::default();
        let (read, declined) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
        let mut runner = TestRunner::new(Config {
            cases: 20_000,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&line(), |line| {
                let mut w = WireLine::default();
                match scan(&line, &mut w) {
                    Some(()) => read.set(read.get() + 1),
                    None => declined.set(declined.get() + 1),
                }
                let either = parse_line_with(&line, NOW, &limits);
                let serde = read_with_serde(&line).and_then(|w| validate(w, NOW, &limits));
                prop_assert_eq!(format!("{either:?}"), format!("{serde:?}"), "{}", line);
                Ok(())
            })
            .unwrap();
        // Neither path is left untested by the generator.
        let (read, declined) = (read.get(), declined.get());
        assert!(
            read > 2_000 && declined > 2_000,
            "read {read}, declined {declined}"
        );
    }

    /// Numbers at the edges of how `serde_json` reads them (integers as
    /// integers, the sign of zero, past `u64`, past `f64`, below its
    /// least), in each number field of a price line the fast path takes.
    #[test]
    fn edge_numbers_read_as_serde_does() {
        let limits = Limits::default();
        let numbers = [
            "-0",
            "0",
            "-0.0",
            "0e5",
            "-0e-5",
            "1",
            "1.0",
            "1e0",
            "0.5e1",
            "1E400",
            "1e-400",
            "-1e-400",
            "4.9e-324",
            "2.5e-324",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "1756771199",
            "1756771199.9999999",
            "1.756771199e9",
            "0.1",
            "0.30000000000000004",
            "0.999999999999999999999",
        ];
        for n in numbers {
            for line in [
                format!(
                    r#"{{"kind":"price","market_id":"m","token_id":"t","ts":1756771199,"p":{n}}}"#
                ),
                format!(r#"{{"kind":"price","market_id":"m","token_id":"t","ts":{n},"p":0.5}}"#),
                format!(
                    r#"{{"kind":"metrics","market_id":"m","ts":1756771199,"volume":{n},"liquidity":{n},"spread":{n}}}"#
                ),
            ] {
                let either = parse_line_with(&line, NOW, &limits);
                let serde = read_with_serde(&line).and_then(|w| validate(w, NOW, &limits));
                assert_eq!(format!("{either:?}"), format!("{serde:?}"), "{line}");
            }
        }
    }

    #[test]
    fn ticks_as_pipelines_send_them_take_the_fast_path() {
        for line in [
            r#"{"kind":"price","market_id":"lt13","token_id":"lt13-yes","ts":1756771199,"p":0.324}"#,
            r#" { "kind" : "price" , "token_id" : "t", "market_id":"m", "p": 1, "ts": "2025-09-01T00:00:00Z" } "#,
            r#"{"kind":"metrics","market_id":"m1","ts":1756771199.5,"volume":1e3,"liquidity":0,"spread":0.01}"#,
            r#"{"kind":"trade","market_id":"m","token_id":"t","ts":1756771199,"price":0.5,"size":2,"side":"sell"}"#,
        ] {
            assert!(scan(line, &mut WireLine::default()).is_some(), "{line}");
        }
        for line in [
            r#"{"kind":"price","market_id":"m","token_id":"t\u0031","ts":1756771199,"p":0.3}"#,
            r#"{"kind":"price","market_id":"m","token_id":"t","ts":1756771199,"p":0.3,"source":"x"}"#,
            r#"{"kind":"price","market_id":"m","token_id":"t","ts":1756771199,"p":0.3,"p":0.4}"#,
            r#"{"kind":"price","market_id":"m","token_id":"t","ts":1756771199,"p":null}"#,
            r#"{"kind":"book","market_id":"m","token_id":"t","ts":1756771199,"bids":[],"asks":[]}"#,
            r#"{"kind":"price","market_id":"m","token_id":"t","ts":1756771199,"p":0.3}x"#,
        ] {
            assert!(scan(line, &mut WireLine::default()).is_none(), "{line}");
        }
    }

    /// Eight bytes at a time, the end of a string is the first byte a byte
    /// at a time stops at, wherever it lies (ASCII, UTF-8's high bytes and
    /// every byte around the three that stop it, at every offset).
    #[test]
    fn a_string_ends_where_a_byte_at_a_time_ends_it() {
        let stops = |b: u8| b == b'"' || b == b'\\' || b < 0x20;
        let byte = prop_oneof![
            Just(b'"'),
            Just(b'\\'),
            Just(0x1f),
            Just(0x20),
            Just(0x21),
            Just(0x5b),
            Just(0x5d),
            Just(0x7f),
            Just(0x80),
            Just(0xff),
            any::<u8>(),
            b'a'..=b'z',
        ];
        let mut runner = TestRunner::new(Config {
            cases: 20_000,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&prop::collection::vec(byte, 0..40), |bytes| {
                let want = bytes.iter().position(|&b| stops(b));
                prop_assert_eq!(string_end(&bytes), want, "{:?}", bytes);
                Ok(())
            })
            .unwrap();
    }
}
