//! `pow` against `f64`'s `powf` (whose special cases are C99's too): a million pairs of
//! arguments where the result is in range and where it is not, and every pair of special
//! values bit for bit.

use super::super::check::ulps;
use super::*;

/// A deterministic stream of 64-bit words (SplitMix64).
fn words(seed: u64) -> impl Iterator<Item = u64> {
    let mut z = seed;
    std::iter::repeat_with(move || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut v = z;
        v = (v ^ (v >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        v = (v ^ (v >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        v ^ (v >> 31)
    })
}

/// A uniform value in `[-1, 1)` from a word.
fn unit(w: u64) -> f32 {
    (w >> 40) as f32 / 8_388_608.0 - 1.0
}

/// `n` pairs: any positive `x` with `y` such that `|y·log2 x| ≤ 160` (results across the
/// whole range, subnormals and overflow included), `x` near 1 with large `y`, negative `x`
/// with integer `y`, and any bits for both.
fn pairs(n: usize, seed: u64) -> impl Iterator<Item = (f32, f32)> {
    let mut w = words(seed);
    (0..n).map(move |i| {
        let (a, b) = (w.next().unwrap_or(0), w.next().unwrap_or(0));
        match i % 4 {
            0 => {
                let x = f32::from_bits((a as u32) & 0x7f7f_ffff);
                let l = (x as f64).log2().abs().max(1e-3);
                (x, (unit(b) as f64 * 160.0 / l) as f32)
            }
            1 => {
                let x = 1.0 + unit(a) * 2f32.powi(-((b % 24) as i32));
                (x, unit(b >> 8) * 2f32.powi((b % 30) as i32))
            }
            2 => {
                let x = -f32::from_bits(0x3000_0000 + ((a as u32) % 0x1e00_0000));
                (x, ((b % 81) as f32 - 40.0).round())
            }
            _ => (f32::from_bits(a as u32), f32::from_bits(b as u32)),
        }
    })
}

/// The error of `pow_f32(x, y)` against `f64`, infinite where a zero's or an infinity's sign
/// or a `nan` disagrees.
fn error(x: f32, y: f32) -> f64 {
    let got = pow_f32(x, y);
    let want = (x as f64).powf(y as f64);
    let rounded = want as f32;
    if rounded == 0.0 && got == 0.0 && got.to_bits() != rounded.to_bits() {
        return f64::INFINITY;
    }
    if rounded.is_infinite() && got.is_infinite() && got != rounded {
        return f64::INFINITY;
    }
    ulps(got, want)
}

fn worst(inputs: impl Iterator<Item = (f32, f32)>) -> (f64, f32, f32) {
    let mut worst = (0.0, 0.0, 0.0);
    for (x, y) in inputs {
        let e = error(x, y);
        if e > worst.0 {
            worst = (e, x, y);
        }
    }
    worst
}

#[test]
fn a_million_pairs_are_within_the_stated_accuracy() {
    let (e, x, y) = worst(pairs(1_000_000, 1));
    assert!(e <= POW_MAX_ULPS, "pow: {e} ulps at ({x:e}, {y:e})");
}

#[test]
#[ignore = "two hundred million pairs: minutes in release"]
fn many_pairs() {
    let (e, x, y) = worst(pairs(200_000_000, 2));
    eprintln!("pow: {e} ulps at ({x:e}, {y:e})");
    assert!(e <= POW_MAX_ULPS);
}

#[test]
fn special_values_follow_c() {
    let odd = 16_777_215f32;
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        3.0,
        -3.0,
        2.5,
        -2.5,
        0.3,
        1e10,
        -1e10,
        odd,
        -odd,
        8_388_609.0,
        16_777_218.0,
        1e-45,
        -1e-45,
        f32::MIN_POSITIVE,
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ];
    for x in specials {
        for y in specials {
            let e = error(x, y);
            assert!(e <= POW_MAX_ULPS, "pow({x:e}, {y:e}) = {:e}, {e} ulps", pow_f32(x, y));
        }
    }
    assert_eq!(pow_f32(f32::NAN, -0.0), 1.0);
    assert_eq!(pow_f32(1.0, f32::NAN), 1.0);
    assert_eq!(pow_f32(-1.0, f32::INFINITY), 1.0);
    assert!(pow_f32(-1.0, f32::NAN).is_nan());
    assert_eq!(pow_f32(-0.0, 3.0).to_bits(), (-0f32).to_bits());
    assert_eq!(pow_f32(-0.0, 0.5).to_bits(), 0);
    assert_eq!(pow_f32(f32::NEG_INFINITY, -3.0).to_bits(), (-0f32).to_bits());
    assert_eq!(pow_f32(f32::NEG_INFINITY, 3.0), f32::NEG_INFINITY);
    assert_eq!(pow_f32(f32::NEG_INFINITY, 0.5), f32::INFINITY);
    assert_eq!(pow_f32(0.5, f32::INFINITY).to_bits(), 0);
    assert_eq!(pow_f32(0.5, f32::NEG_INFINITY), f32::INFINITY);
    assert_eq!(pow_f32(2.0, -149.0), 1e-45, "a subnormal result");
    assert_eq!(pow_f32(2.0, 128.0), f32::INFINITY);
}

#[test]
fn integer_powers_are_exact() {
    for b in [-3.0f32, -2.0, 1.5, 3.0, 10.0] {
        let mut want = 1f64;
        for k in 0..20 {
            if want.abs() < 1e7 {
                assert_eq!(pow_f32(b, k as f32), want as f32, "{b}^{k}");
            }
            want *= b as f64;
        }
    }
}
