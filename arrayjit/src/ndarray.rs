//! Host arrays in any precision.
//!
//! An [`NdArray`] is what crosses the boundary between the host and a context: dense row-major
//! data with its dims, stored in its own precision (crate `half` for `f16`/`bf16`). Conversions
//! go through `f64`, which represents every value of every supported precision exactly.

use crate::error::Error;
use crate::ops::Prec;

/// Typed storage of an [`NdArray`].
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    /// Half precision.
    F16(Vec<half::f16>),
    /// bfloat16.
    Bf16(Vec<half::bf16>),
    /// Single precision.
    F32(Vec<f32>),
    /// Double precision.
    F64(Vec<f64>),
    /// Unsigned 32-bit integers (ids).
    U32(Vec<u32>),
}

/// A dense row-major host array.
///
/// ```
/// use rocannl_arrayjit::ndarray::NdArray;
/// use rocannl_arrayjit::ops::Prec;
/// let a = NdArray::from_f64(Prec::Bf16, &[2, 2], &[1.0, 2.0, 3.0, 1.0 / 3.0]).unwrap();
/// assert_eq!(a.dims(), &[2, 2]);
/// assert_eq!(a.to_f64_vec()[..3], [1.0, 2.0, 3.0]);
/// assert_eq!(a.to_f64_vec()[3], 0.333984375); // rounded to bf16
/// assert!(NdArray::from_f64(Prec::F32, &[3], &[1.0]).is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NdArray {
    dims: Vec<usize>,
    storage: Storage,
}

impl NdArray {
    /// An array of zeros.
    pub fn zeros(prec: Prec, dims: &[usize]) -> NdArray {
        let n = dims.iter().product();
        let storage = match prec {
            Prec::F16 => Storage::F16(vec![half::f16::ZERO; n]),
            Prec::Bf16 => Storage::Bf16(vec![half::bf16::ZERO; n]),
            Prec::F32 => Storage::F32(vec![0.0; n]),
            Prec::F64 => Storage::F64(vec![0.0; n]),
            Prec::U32 => Storage::U32(vec![0; n]),
        };
        NdArray { dims: dims.to_vec(), storage }
    }

    /// An array of precision `prec` from `f64` values (rounded to nearest even; for
    /// [`Prec::U32`], every value must be an integer in `0 .. 2³²`, else
    /// [`Error::NotAnInteger`]).
    pub fn from_f64(prec: Prec, dims: &[usize], data: &[f64]) -> Result<NdArray, Error> {
        let n: usize = dims.iter().product();
        if n != data.len() {
            return Err(Error::DataLength { dims: dims.to_vec(), expected: n, got: data.len() });
        }
        let storage = match prec {
            Prec::F16 => Storage::F16(data.iter().map(|&x| crate::ops::f16_from_f64(x)).collect()),
            Prec::Bf16 => {
                Storage::Bf16(data.iter().map(|&x| crate::ops::bf16_from_f64(x)).collect())
            }
            Prec::F32 => Storage::F32(data.iter().map(|&x| x as f32).collect()),
            Prec::F64 => Storage::F64(data.to_vec()),
            Prec::U32 => {
                let bad = data.iter().position(|&x| !Prec::is_u32_value(x));
                if let Some(index) = bad {
                    return Err(Error::NotAnInteger { index, value: data[index] });
                }
                Storage::U32(data.iter().map(|&x| x as u32).collect())
            }
        };
        Ok(NdArray { dims: dims.to_vec(), storage })
    }

    /// An `f32` array.
    pub fn from_f32(dims: &[usize], data: &[f32]) -> Result<NdArray, Error> {
        let n: usize = dims.iter().product();
        if n != data.len() {
            return Err(Error::DataLength { dims: dims.to_vec(), expected: n, got: data.len() });
        }
        Ok(NdArray { dims: dims.to_vec(), storage: Storage::F32(data.to_vec()) })
    }

    /// The dims.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        match &self.storage {
            Storage::F16(_) => Prec::F16,
            Storage::Bf16(_) => Prec::Bf16,
            Storage::F32(_) => Prec::F32,
            Storage::F64(_) => Prec::F64,
            Storage::U32(_) => Prec::U32,
        }
    }

    /// The typed storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::F16(v) => v.len(),
            Storage::Bf16(v) => v.len(),
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
            Storage::U32(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, converted exactly to `f64`.
    /// Cell `i` (in memory order) as an `f64`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn get_f64(&self, i: usize) -> f64 {
        match &self.storage {
            Storage::F16(v) => v[i].to_f64(),
            Storage::Bf16(v) => v[i].to_f64(),
            Storage::F32(v) => v[i] as f64,
            Storage::F64(v) => v[i],
            Storage::U32(v) => v[i] as f64,
        }
    }

    /// Every cell as an `f64`, in memory order.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.storage {
            Storage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Storage::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Storage::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Storage::F64(v) => v.clone(),
            Storage::U32(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// The same values in another precision.
    pub fn convert(&self, prec: Prec) -> NdArray {
        if prec == self.prec() {
            return self.clone();
        }
        let data = self.to_f64_vec();
        NdArray::from_f64(prec, &self.dims, &data).unwrap_or_else(|_| NdArray::zeros(prec, &[0]))
    }

    /// The raw little-endian bytes (the layout of a buffer of this precision).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len() * self.prec().size_in_bytes()];
        self.write_le_bytes(&mut out);
        out
    }

    /// Writes the raw little-endian bytes into `dst`, which holds exactly
    /// `len × size_in_bytes` of them (a buffer of this precision): one pass, no allocation.
    pub fn write_le_bytes(&self, dst: &mut [u8]) {
        fn put<const W: usize, T: Copy>(dst: &mut [u8], v: &[T], f: impl Fn(T) -> [u8; W]) {
            debug_assert_eq!(dst.len(), v.len() * W);
            for (c, x) in dst.chunks_exact_mut(W).zip(v) {
                c.copy_from_slice(&f(*x));
            }
        }
        match &self.storage {
            Storage::F16(v) => put(dst, v, half::f16::to_le_bytes),
            Storage::Bf16(v) => put(dst, v, half::bf16::to_le_bytes),
            Storage::F32(v) => put(dst, v, f32::to_le_bytes),
            Storage::F64(v) => put(dst, v, f64::to_le_bytes),
            Storage::U32(v) => put(dst, v, u32::to_le_bytes),
        }
    }

    /// An array from raw little-endian bytes of precision `prec`.
    pub fn from_bytes(prec: Prec, dims: &[usize], bytes: &[u8]) -> Result<NdArray, Error> {
        let n: usize = dims.iter().product();
        let w = prec.size_in_bytes();
        if bytes.len() != n * w {
            let got = bytes.len() / w;
            return Err(Error::DataLength { dims: dims.to_vec(), expected: n, got });
        }
        let storage = match prec {
            Prec::F16 => Storage::F16(try_collect(
                n,
                bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])),
            )?),
            Prec::Bf16 => Storage::Bf16(try_collect(
                n,
                bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])),
            )?),
            Prec::F32 => Storage::F32(try_collect(
                n,
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            )?),
            Prec::F64 => Storage::F64(try_collect(
                n,
                bytes.chunks_exact(8).map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    f64::from_le_bytes(a)
                }),
            )?),
            Prec::U32 => Storage::U32(try_collect(
                n,
                bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            )?),
        };
        Ok(NdArray { dims: dims.to_vec(), storage })
    }
}

/// Collects `n` items into a vector allocated fallibly: an array too large for memory is an
/// [`Error::Alloc`], not an abort.
fn try_collect<T>(n: usize, items: impl Iterator<Item = T>) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Alloc {
        what: "a host array".to_string(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    v.extend(items);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_in_every_precision() {
        for prec in Prec::ALL {
            let a = NdArray::from_f64(prec, &[3], &[0.5, -2.0, 1e3]).unwrap();
            let b = NdArray::from_bytes(prec, &[3], &a.to_bytes()).unwrap();
            assert_eq!(a, b);
            assert_eq!(b.to_f64_vec(), vec![0.5, -2.0, 1e3]);
        }
    }

    #[test]
    fn convert_rounds() {
        let a = NdArray::from_f64(Prec::F64, &[1], &[0.1]).unwrap();
        assert_eq!(a.convert(Prec::F32).to_f64_vec(), vec![0.1f32 as f64]);
    }
}
