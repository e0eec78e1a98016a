//! Small datasets for the examples and their tests.
//!
//! - [`half_moons`]: two interleaving half circles with Gaussian noise (generated, seeded);
//! - [`digits`]: the 1,797 8×8 handwritten digits bundled in `data/digits.csv` (UCI optical
//!   digits, CC BY 4.0; see `data/README.md`);
//! - [`names`]: 5,163 first names bundled in `data/names.txt` (1990 US Census, public domain);
//! - [`names_32k`]: the 32,033 most common US baby names of 2018 bundled in
//!   `data/names32k.txt`, the list most character-level language-model tutorials train on
//!   (US Social Security Administration data, public domain, as distributed with makemore).
//!
//! Random numbers come from the same counter-based generator as parameter initialization, so a
//! seed gives the same data everywhere.

/// The counter-based generator of initializations and datasets: SplitMix64 of `seed` and
/// `offset`, a draw in `[0, 1)` with 24 bits. Examples draw their batches with it, so that a
/// script in another framework can draw the same ones.
pub use rocannl_arrayjit::ops::uniform;

/// Points and labels of a binary classification problem.
#[derive(Clone, Debug, PartialEq)]
pub struct Points {
    /// `n × 2` coordinates, one point after the other.
    pub xy: Vec<f64>,
    /// `n` labels, `+1` or `-1`.
    pub labels: Vec<f64>,
}

/// A standard normal sample from two uniforms (Box–Muller).
fn normal(seed: u64, i: u64) -> f64 {
    let u1 = uniform(seed, 2 * i);
    let u2 = uniform(seed, 2 * i + 1);
    (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// `n` points on two interleaving half circles (as scikit-learn's `make_moons`), with noise of
/// standard deviation `noise`; labels `+1` (upper moon) and `-1` (lower moon), alternating.
///
/// ```
/// let p = rocannl::datasets::half_moons(100, 0.1, 0);
/// assert_eq!(p.xy.len(), 200);
/// assert_eq!(p.labels.iter().filter(|l| **l > 0.0).count(), 50);
/// ```
pub fn half_moons(n: usize, noise: f64, seed: u64) -> Points {
    let mut xy = Vec::with_capacity(2 * n);
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let t = std::f64::consts::PI * uniform(seed ^ 0x5EED, i as u64);
        let (x, y, l) =
            if i % 2 == 0 { (t.cos(), t.sin(), 1.0) } else { (1.0 - t.cos(), 0.5 - t.sin(), -1.0) };
        xy.push(x + noise * normal(seed, 2 * i as u64));
        xy.push(y + noise * normal(seed, 2 * i as u64 + 1));
        labels.push(l);
    }
    Points { xy, labels }
}

/// The handwritten digits: 8×8 images scaled to `[0, 1]` and their labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Digits {
    /// `n × 64` pixels, row-major per image.
    pub images: Vec<f64>,
    /// `n` labels, `0..=9`.
    pub labels: Vec<f64>,
}

impl Digits {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The labels as one-hot rows of 10.
    pub fn one_hot(&self) -> Vec<f64> {
        self.labels
            .iter()
            .flat_map(|l| (0..10).map(move |c| if c as f64 == *l { 1.0 } else { 0.0 }))
            .collect()
    }

    /// Splits into the first `n` images and the rest.
    pub fn split(&self, n: usize) -> (Digits, Digits) {
        let n = n.min(self.len());
        (
            Digits { images: self.images[..n * 64].to_vec(), labels: self.labels[..n].to_vec() },
            Digits { images: self.images[n * 64..].to_vec(), labels: self.labels[n..].to_vec() },
        )
    }
}

/// The bundled digits, in file order.
///
/// ```
/// let d = rocannl::datasets::digits();
/// assert_eq!(d.len(), 1797);
/// assert_eq!(d.images.len(), 1797 * 64);
/// ```
pub fn digits() -> Digits {
    let text = include_str!("../data/digits.csv");
    let mut images = Vec::with_capacity(1797 * 64);
    let mut labels = Vec::with_capacity(1797);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let values: Vec<f64> = line.split(',').filter_map(|v| v.trim().parse().ok()).collect();
        if values.len() == 65 {
            images.extend(values[..64].iter().map(|p| p / 16.0));
            labels.push(values[64]);
        }
    }
    Digits { images, labels }
}

/// The bundled first names, lower case, sorted.
///
/// ```
/// let names = rocannl::datasets::names();
/// assert_eq!(names.len(), 5163);
/// assert!(names.iter().all(|n| n.chars().all(|c| c.is_ascii_lowercase())));
/// ```
pub fn names() -> Vec<String> {
    include_str!("../data/names.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// The 32,033 names of `data/names32k.txt`, lower case, in the file's order (as the file is
/// distributed, most common first; 29,494 are distinct, some appear more than once). This is the list that most character-level language-model lectures and
/// tutorials use (the `names.txt` of makemore); [`names`] is a different, smaller list.
///
/// ```
/// let names = rocannl::datasets::names_32k();
/// assert_eq!(names.len(), 32_033);
/// assert_eq!(&names[..3], ["emma", "olivia", "ava"]);
/// assert!(names.iter().all(|n| n.chars().all(|c| c.is_ascii_lowercase())));
/// ```
pub fn names_32k() -> Vec<String> {
    include_str!("../data/names32k.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// A fixed, well-mixed order of names: 64-bit FNV-1a of the UTF-8 bytes, then MurmurHash3's
/// `fmix64`. The examples sort names by `(name_key(name), name)` before splitting them, and the
/// reference scripts in other frameworks do the same.
///
/// ```
/// assert_eq!(rocannl::datasets::name_key("a"), 0x82a2_a958_a9be_ce5b);
/// ```
pub fn name_key(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
