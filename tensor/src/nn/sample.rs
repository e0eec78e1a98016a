//! Choosing tokens from logits, for generation: argmax, and sampling at a temperature from the
//! `k` most likely.
//!
//! These run on the host over one row of logits read from a session: generation reads a few
//! dozen numbers per token, and a draw needs the whole row anyway. Draws come from the same
//! counter-based generator as parameter initialization ([`rocannl_arrayjit::ops::uniform`]), so
//! a `(seed, counter)` pair always gives the same token.

use rocannl_arrayjit::ops::uniform;

/// The index of the largest logit (the first of equals); `None` for an empty row. NaN is
/// never chosen over a number (a row of NaN only gives 0).
///
/// ```
/// use rocannl_tensor::nn::sample::argmax;
/// assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), Some(1));
/// assert_eq!(argmax(&[]), None);
/// ```
pub fn argmax(logits: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i).or(if logits.is_empty() { None } else { Some(0) })
}

/// How to draw a token: softmax of `logits / temperature` over the `top_k` largest logits
/// (all when `None`). A temperature of 0 is argmax.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Sampler {
    /// Divides the logits: below 1 sharpens, above 1 flattens; 0 is argmax.
    pub temperature: f64,
    /// Only the `k` most likely tokens can be drawn.
    pub top_k: Option<usize>,
}

impl Default for Sampler {
    /// Temperature 1, every token.
    fn default() -> Self {
        Sampler { temperature: 1.0, top_k: None }
    }
}

impl Sampler {
    /// Draws one index from `logits` with the draw `(seed, counter)`; `None` for an empty row.
    ///
    /// ```
    /// use rocannl_tensor::nn::sample::Sampler;
    /// let logits = [1.0, 3.0, 0.5];
    /// let greedy = Sampler { temperature: 0.0, top_k: None };
    /// assert_eq!(greedy.sample(&logits, 7, 0), Some(1));
    /// let top1 = Sampler { temperature: 1.0, top_k: Some(1) };
    /// assert_eq!(top1.sample(&logits, 7, 3), Some(1));
    /// let any = Sampler::default().sample(&logits, 7, 3).unwrap();
    /// assert!(any < 3);
    /// ```
    pub fn sample(&self, logits: &[f64], seed: u64, counter: u64) -> Option<usize> {
        let best = argmax(logits)?;
        if self.temperature <= 0.0 || self.top_k == Some(1) {
            return Some(best);
        }
        let mut order: Vec<usize> = (0..logits.len()).filter(|i| !logits[*i].is_nan()).collect();
        if let Some(k) = self.top_k {
            order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
            order.truncate(k.max(1));
        }
        if order.is_empty() {
            return Some(best);
        }
        let top = logits[best];
        let weights: Vec<f64> =
            order.iter().map(|i| ((logits[*i] - top) / self.temperature).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut u = uniform(seed, counter) * total;
        for (i, w) in order.iter().zip(&weights) {
            if u < *w {
                return Some(*i);
            }
            u -= w;
        }
        // Rounding left the draw past the last weight: the last candidate.
        order.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_softmax_of_the_kept_logits() {
        let logits = [0.0, 1.0, 2.0, -1.0];
        let n = 20_000u64;
        for (sampler, kept) in [
            (Sampler::default(), vec![0, 1, 2, 3]),
            (Sampler { temperature: 0.5, top_k: None }, vec![0, 1, 2, 3]),
            (Sampler { temperature: 1.0, top_k: Some(2) }, vec![1, 2]),
        ] {
            let mut counts = [0u64; 4];
            for c in 0..n {
                counts[sampler.sample(&logits, 11, c).unwrap()] += 1;
            }
            let z: f64 = kept.iter().map(|i| (logits[*i] / sampler.temperature).exp()).sum();
            for (i, count) in counts.iter().enumerate() {
                let p = if kept.contains(&i) {
                    (logits[i] / sampler.temperature).exp() / z
                } else {
                    0.0
                };
                // Five standard errors of a frequency over 20,000 draws (at most 0.0035 each).
                let tol = 5.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-12;
                let f = *count as f64 / n as f64;
                assert!((f - p).abs() <= tol, "{sampler:?}: token {i} drawn {f}, expected {p}");
            }
        }
    }

    #[test]
    fn nan_logits_are_never_drawn() {
        let logits = [f64::NAN, 0.0, f64::NAN];
        assert_eq!(argmax(&logits), Some(1));
        for c in 0..100 {
            assert_eq!(Sampler::default().sample(&logits, 1, c), Some(1));
        }
    }
}
