//! `sin` and `cos` against `f64`'s (whose argument reduction is exact for every `f64`): the
//! whole range, the inputs closest to multiples of π/2, and the special values.

use super::super::check::{assert_within, every, ulps, worst};
use super::*;

/// The first 216 bits of 2/π in hexadecimal.
const TWO_OVER_PI_HEX: &str = "A2F9836E4E441529FC2757D1F534DDC0DB6295993C439041FE5163";

/// The `f32`s whose `x·2/π` is closest to an integer, each the closest of its binade (as
/// `m·2ᵏ`, found by trying every `m`): `16367173·2⁷²` comes within 2⁻²⁹·⁸⁶ of one, the
/// closest of all.
const HARDEST: [(u32, i32); 16] = [
    (16_367_173, 72),
    (10_741_887, 11),
    (16_573_937, -16),
    (10_057_457, 62),
    (11_617_958, 17),
    (9_012_376, 53),
    (14_173_733, 88),
    (10_695_401, 2),
    (9_882_596, -21),
    (14_015_064, 66),
    (8_895_696, 34),
    (13_444_207, -8),
    (12_558_490, 78),
    (10_838_702, -2),
    (12_438_944, 103),
    (12_615_508, 92),
];

/// The inputs that make the reduction hardest: [`HARDEST`] with their other binades and
/// neighbours, and the `f32`s around `k·π/2` for the first 200 000 `k` and for `k` spread up to
/// 2¹²⁰.
fn hard_inputs() -> Vec<f32> {
    let mut xs = vec![];
    for (m, k) in HARDEST {
        for shift in -2..=2 {
            let x = m as f32 * 2f32.powi(k + shift);
            if x.is_finite() {
                for d in -2i32..=2 {
                    xs.push(f32::from_bits((x.to_bits() as i32 + d) as u32));
                }
            }
        }
    }
    let near = |y: f64, xs: &mut Vec<f32>| {
        let x = y as f32;
        for d in -1i32..=1 {
            xs.push(f32::from_bits((x.to_bits() as i32 + d) as u32));
        }
    };
    for k in 1..200_000 {
        near(k as f64 * std::f64::consts::FRAC_PI_2, &mut xs);
    }
    for i in 0..20_000 {
        let k = 2f64.powf(i as f64 * 120.0 / 20_000.0).round();
        near(k * std::f64::consts::FRAC_PI_2, &mut xs);
    }
    xs.extend([f32::MAX, -f32::MAX, f32::from_bits(0x7f7f_fffe), 1e38, 3e38]);
    xs
}

#[test]
fn the_pieces_are_two_over_pi() {
    let digits: Vec<u32> =
        TWO_OVER_PI_HEX.chars().map(|c| c.to_digit(16).expect("a hex digit")).collect();
    let bit = |b: usize| (digits[b / 4] >> (3 - b % 4)) & 1;
    for (i, &c) in TWO_OVER_PI.iter().enumerate() {
        let bits = (0..26).fold(0u32, |v, b| (v << 1) | bit(26 * i + b));
        assert_eq!(c, bits as f64 * 2f64.powi(-26 * (i as i32 + 1)), "piece {i}");
    }
    let sum: f64 = TWO_OVER_PI.iter().rev().sum();
    assert_eq!(sum, std::f64::consts::FRAC_2_PI);
    for (i, &from) in DROP_FROM.iter().enumerate() {
        assert_eq!(from, 2f64.powi(26 * i as i32 + 51));
    }
    // From piece 5 on, products with any f32 are below 1/8.
    assert!(f32::MAX as f64 * TWO_OVER_PI[WHOLE_PIECES] < 0.125);
}

#[test]
fn a_million_inputs_are_within_the_stated_accuracy() {
    assert_within("sin", sin_f32, f64::sin, SIN_MAX_ULPS, (-10.0, 10.0));
    assert_within("cos", cos_f32, f64::cos, COS_MAX_ULPS, (-10.0, 10.0));
}

#[test]
fn the_hardest_reductions_are_within_the_stated_accuracy() {
    let xs = hard_inputs();
    for (name, f, exact, bound) in [
        ("sin", sin_f32 as fn(f32) -> f32, f64::sin as fn(f64) -> f64, SIN_MAX_ULPS),
        ("cos", cos_f32, f64::cos, COS_MAX_ULPS),
    ] {
        let (e, x) = worst(f, exact, xs.iter().copied());
        assert!(e <= bound, "{name}: {e} ulps at {x:e} (bound {bound})");
    }
    // The hardest is hard: the sine or the cosine is tiny there, and right.
    let x = (16_367_173f32 * 2f32.powi(72)) as f64;
    assert!(x.sin().abs().min(x.cos().abs()) < 2e-9);
    assert!(ulps(sin_f32(x as f32), x.sin()) <= SIN_MAX_ULPS);
    assert!(ulps(cos_f32(x as f32), x.cos()) <= COS_MAX_ULPS);
}

#[test]
#[ignore = "every f32 input: minutes in release"]
fn exhaustive_accuracy() {
    let ((s, x), (c, y)) = std::thread::scope(|scope| {
        let sin = scope.spawn(|| worst(sin_f32, f64::sin, every(1)));
        let cos = worst(cos_f32, f64::cos, every(1));
        (sin.join().expect("the sine's half"), cos)
    });
    eprintln!("sin: {s} ulps at {x:e}; cos: {c} ulps at {y:e}");
    assert!(s <= SIN_MAX_ULPS && c <= COS_MAX_ULPS);
}

#[test]
fn sin_is_odd_and_cos_even() {
    for x in every(65_537).chain(hard_inputs()) {
        assert_eq!(sin_f32(-x).to_bits(), (-sin_f32(x)).to_bits(), "sin at {x:e}");
        assert_eq!(cos_f32(-x).to_bits(), cos_f32(x).to_bits(), "cos at {x:e}");
    }
}

#[test]
fn special_values_follow_c() {
    assert_eq!(sin_f32(0.0).to_bits(), 0);
    assert_eq!(sin_f32(-0.0).to_bits(), (-0f32).to_bits());
    assert_eq!(cos_f32(0.0), 1.0);
    assert_eq!(cos_f32(-0.0), 1.0);
    for x in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN] {
        assert!(sin_f32(x).is_nan() && cos_f32(x).is_nan(), "{x}");
    }
    // Subnormals and tiny normals: sin x = x, cos x = 1.
    for x in [1e-45f32, -1e-45, 1e-40, -3e-39, f32::MIN_POSITIVE, 1e-20, -1e-10] {
        assert_eq!(sin_f32(x), x, "sin({x:e})");
        assert_eq!(cos_f32(x), 1.0, "cos({x:e})");
    }
    // Exact quadrants of small arguments.
    assert_eq!(sin_f32(std::f32::consts::FRAC_PI_2), 1.0);
    assert_eq!(cos_f32(std::f32::consts::PI), -1.0);
    assert_eq!(sin_f32(-std::f32::consts::FRAC_PI_2), -1.0);
}
