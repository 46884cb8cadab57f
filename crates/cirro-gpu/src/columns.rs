//! Arrow columns as the kernels read them. Every supported type becomes
//! 32- or 64-bit words whose integer order is the SQL order, so one
//! comparison in the kernel serves every type:
//! - SMALLINT, INTEGER, DATE: `i32`; BIGINT, TIMESTAMP, NUMERIC of at most
//!   18 digits (the scaled integer): `i64`;
//! - REAL and DOUBLE: the bits made an integer in the order DataFusion
//!   compares floats (`f64::total_cmp` with -0 read as +0: -NaN < -inf < …
//!   < 0 < … < inf < NaN; measured: `-0.0 >= 0` and `-0.0 = 0` are true,
//!   `NaN > 1e300` is true, `-NaN = NaN` false), NaN included;
//! - BOOLEAN: its bitmap;
//! - text: a code into the block's sorted dictionary of distinct values
//!   (the order of the codes is the order of the strings), which turns
//!   comparisons with a constant into comparisons of codes with the
//!   constant's bounds in the dictionary, computed per block.
//!
//! NULLs: Arrow's validity bitmap, as 32-bit words.

use std::collections::{BTreeSet, HashMap};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::buffer::Buffer;
use arrow::datatypes::{ArrowNativeType, ArrowPrimitiveType};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, UInt8Type, UInt16Type, UInt32Type,
};

/// How a column's values sit in a kernel's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Repr {
    I32,
    I64,
    /// A bitmap (BOOLEAN).
    Bits,
    /// A `u32` code into the block's sorted dictionary (text).
    Code,
}

impl Repr {
    /// The WGSL element type of the buffer.
    pub fn wgsl(self) -> &'static str {
        match self {
            Repr::I32 => "i32",
            Repr::I64 => "i64",
            Repr::Bits | Repr::Code => "u32",
        }
    }

    /// Bytes per row on the device (a bitmap: one bit, counted as 1).
    pub fn width(self) -> u64 {
        match self {
            Repr::I64 => 8,
            Repr::Bits => 1,
            Repr::I32 | Repr::Code => 4,
        }
    }
}

/// The representation of `data_type`, None where kernels cannot read it.
pub fn repr_of(data_type: &DataType) -> Option<Repr> {
    Some(match data_type {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::UInt8
        | DataType::UInt16
        | DataType::Date32
        | DataType::Float32 => Repr::I32,
        DataType::Int64
        | DataType::UInt32
        | DataType::Float64
        | DataType::Timestamp(_, _)
        | DataType::Date64 => Repr::I64,
        DataType::Decimal128(p, _) if *p <= 18 => Repr::I64,
        DataType::Boolean => Repr::Bits,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Repr::Code,
        _ => return None,
    })
}

/// A column encoded for the device: its values, its validity (None: no
/// NULLs), and for text the sorted distinct values its codes index.
#[derive(Debug)]
pub struct HostColumn {
    pub repr: Repr,
    pub values: Buffer,
    pub validity: Option<Buffer>,
    pub dictionary: Vec<String>,
}

impl HostColumn {
    /// Row `r`'s value as the 32-bit words of a hash key: one, or two (low
    /// first) for 64-bit values.
    pub fn key_words(&self, r: usize) -> &[u8] {
        let width = if self.repr == Repr::I64 { 8 } else { 4 };
        &self.values.as_slice()[r * width..(r + 1) * width]
    }
}

/// Little-endian bytes as 32-bit words.
pub fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// `f64::total_cmp`'s key, -0 made +0: an integer in the order in which
/// DataFusion compares floats.
pub fn f64_key(x: f64) -> i64 {
    total_key64(if x == 0.0 { 0.0 } else { x })
}

/// `f32::total_cmp`'s key, -0 made +0.
pub fn f32_key(x: f32) -> i32 {
    total_key32(if x == 0.0 { 0.0 } else { x })
}

/// `f64::total_cmp`'s key: an integer in the same order as the float.
pub fn total_key64(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}

pub fn total_key32(x: f32) -> i32 {
    let bits = x.to_bits() as i32;
    bits ^ ((((bits >> 31) as u32) >> 1) as i32)
}

/// The float whose [`total_key64`] is `key` (the mapping keeps the sign
/// bit, so it is its own inverse).
pub fn from_total_key64(key: i64) -> f64 {
    f64::from_bits((key ^ ((((key >> 63) as u64) >> 1) as i64)) as u64)
}

/// The float whose [`total_key32`] is `key`.
pub fn from_total_key32(key: i32) -> f32 {
    f32::from_bits((key ^ ((((key >> 31) as u32) >> 1) as i32)) as u32)
}

/// `array` encoded as [`repr_of`] its type says, for comparisons (-0 and
/// +0 equal); None for other types.
pub fn encode(array: &ArrayRef) -> Option<HostColumn> {
    encode_with(array, true)
}

/// `array` encoded for sorting: floats in `total_cmp`'s order, which puts
/// -0 before +0 as DataFusion's sort does (measured: `ORDER BY f` gives
/// -NaN, -inf, -0.0, 0.0, NaN).
pub fn encode_for_sort(array: &ArrayRef) -> Option<HostColumn> {
    encode_with(array, false)
}

fn encode_with(array: &ArrayRef, one_zero: bool) -> Option<HostColumn> {
    let repr = repr_of(array.data_type())?;
    let key64 = |x: f64| if one_zero { f64_key(x) } else { total_key64(x) };
    let key32 = |x: f32| if one_zero { f32_key(x) } else { total_key32(x) };
    let values = match array.data_type() {
        DataType::Int32 => array.as_primitive::<Int32Type>().values().inner().clone(),
        DataType::Date32 => array.as_primitive::<Date32Type>().values().inner().clone(),
        DataType::Int64 => array.as_primitive::<Int64Type>().values().inner().clone(),
        DataType::Int8 => mapped::<Int8Type, _>(array, i32::from),
        DataType::Int16 => mapped::<Int16Type, _>(array, i32::from),
        DataType::UInt8 => mapped::<UInt8Type, _>(array, i32::from),
        DataType::UInt16 => mapped::<UInt16Type, _>(array, i32::from),
        DataType::UInt32 => mapped::<UInt32Type, _>(array, i64::from),
        DataType::Float32 => mapped::<Float32Type, _>(array, key32),
        DataType::Float64 => mapped::<Float64Type, _>(array, key64),
        // At most 18 digits: fits (repr_of).
        DataType::Decimal128(_, _) => mapped::<Decimal128Type, _>(array, |x| x as i64),
        DataType::Timestamp(_, _) | DataType::Date64 => {
            let data = array.to_data();
            let buffer = &data.buffers()[0];
            buffer.slice_with_length(data.offset() * 8, data.len() * 8)
        }
        DataType::Boolean => array.as_boolean().values().sliced(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            return Some(encode_text(array));
        }
        _ => return None,
    };
    Some(HostColumn {
        repr,
        values,
        validity: validity(array),
        dictionary: Vec::new(),
    })
}

/// The values of a primitive array passed through `f`.
fn mapped<T: ArrowPrimitiveType, U: ArrowNativeType>(
    array: &ArrayRef,
    f: impl Fn(T::Native) -> U,
) -> Buffer {
    let values = array.as_primitive::<T>().values();
    Buffer::from_vec(values.iter().map(|&x| f(x)).collect::<Vec<U>>())
}

/// The validity bitmap of `array`; None without NULLs.
pub fn validity(array: &ArrayRef) -> Option<Buffer> {
    array
        .logical_nulls()
        .filter(|n| n.null_count() > 0)
        .map(|n| n.inner().sliced())
}

/// Text as codes into its sorted distinct values (NULLs: code 0, masked).
fn encode_text(array: &ArrayRef) -> HostColumn {
    let strings: Vec<Option<&str>> = match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().collect(),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().collect(),
        _ => array.as_string_view().iter().collect(),
    };
    let distinct: BTreeSet<&str> = strings.iter().flatten().copied().collect();
    let codes: HashMap<&str, u32> = distinct
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, i as u32))
        .collect();
    let values: Vec<u32> = strings
        .iter()
        .map(|s| s.and_then(|s| codes.get(s).copied()).unwrap_or(0))
        .collect();
    HostColumn {
        repr: Repr::Code,
        values: Buffer::from_vec(values),
        validity: validity(array),
        dictionary: distinct.into_iter().map(str::to_string).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_keys_keep_the_total_order_with_one_zero() {
        assert_eq!(f64_key(-0.0), f64_key(0.0));
        assert_eq!(f32_key(-0.0), f32_key(0.0));
        assert_ne!(f64_key(-f64::NAN), f64_key(f64::NAN));
        assert!(f64_key(-f64::NAN) < f64_key(f64::NEG_INFINITY));
        assert!(f64_key(f64::NAN) > f64_key(f64::INFINITY));
        let mut xs = vec![
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            1.5,
            -1.5,
            f64::MIN_POSITIVE,
        ];
        xs.retain(|x| x.to_bits() != (-0.0f64).to_bits());
        let mut by_key = xs.clone();
        xs.sort_by(f64::total_cmp);
        by_key.sort_by_key(|x| f64_key(*x));
        assert_eq!(
            xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            by_key.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let mut ys = vec![f32::NAN, 0.0f32, -3.0, 2.0, f32::NEG_INFINITY];
        let mut by_key = ys.clone();
        ys.sort_by(f32::total_cmp);
        by_key.sort_by_key(|x| f32_key(*x));
        assert_eq!(
            ys.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            by_key.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn total_keys_come_back_to_their_floats() {
        for x in [
            f64::NAN,
            -f64::NAN,
            -0.0,
            0.0,
            f64::NEG_INFINITY,
            -1.25,
            3e300,
            f64::MIN_POSITIVE,
        ] {
            assert_eq!(from_total_key64(total_key64(x)).to_bits(), x.to_bits());
        }
        for x in [
            f32::NAN,
            -f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            -2.5,
            f32::MAX,
        ] {
            assert_eq!(from_total_key32(total_key32(x)).to_bits(), x.to_bits());
        }
        assert!(total_key64(-0.0) < total_key64(0.0), "min(-0, +0) is -0");
    }
}
