//! The slot a key hashes to: `hash(key) mod m` with the hash DataFusion's
//! `RepartitionExec` partitions by (`REPARTITION_RANDOM_STATE`), so that a
//! row's slot is the partition a hash repartition into `m` partitions puts
//! it in. Bucketed tables place rows by it (`cirro-storage/src/bucket.rs`),
//! and [`hash_slot_udf`] (`cirro_hash_slot(m, key, …)`) lets a plan filter
//! by it (a cluster's scan tasks of a bucketed table, when a task must take
//! part of a bucket).

use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, UInt32Array};
use arrow::datatypes::DataType;
use datafusion::common::hash_utils::create_hashes;
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;

/// The slot (of `modulus`) of every row, given its key columns. Text and
/// binary are hashed as string views, as scans read them (DataFusion
/// hashes a view of up to 12 bytes by the view, a `Utf8` value by its
/// bytes: the two differ).
pub fn hash_slots(keys: &[ArrayRef], modulus: u64) -> Result<Vec<u32>> {
    if modulus == 0 || modulus > u32::MAX as u64 {
        return exec_err!("a hash slot needs a modulus between 1 and {}", u32::MAX);
    }
    let rows = keys.first().map(|k| k.len()).unwrap_or(0);
    let keys = keys
        .iter()
        .map(|key| {
            let view = match key.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
                DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
                _ => return Ok(Arc::clone(key)),
            };
            Ok(arrow::compute::cast(key, &view)?)
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    let mut hashes = vec![0u64; rows];
    create_hashes(&keys, REPARTITION_RANDOM_STATE.random_state(), &mut hashes)?;
    Ok(hashes.into_iter().map(|h| (h % modulus) as u32).collect())
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct HashSlot {
    signature: Signature,
}

impl ScalarUDFImpl for HashSlot {
    fn name(&self) -> &str {
        "cirro_hash_slot"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let Some((modulus, keys)) = args.args.split_first() else {
            return exec_err!("cirro_hash_slot needs a modulus and a key");
        };
        let modulus = match modulus {
            ColumnarValue::Scalar(ScalarValue::UInt64(Some(m))) => *m,
            ColumnarValue::Scalar(ScalarValue::Int64(Some(m))) if *m > 0 => *m as u64,
            other => return exec_err!("cirro_hash_slot: bad modulus {other:?}"),
        };
        if keys.is_empty() {
            return exec_err!("cirro_hash_slot needs a key");
        }
        let keys = ColumnarValue::values_to_arrays(keys)?;
        let keys: Vec<ArrayRef> = keys
            .into_iter()
            .map(|k| {
                if k.len() == args.number_rows {
                    Ok(k)
                } else {
                    // A constant key: one value for every row.
                    ScalarValue::try_from_array(&k, 0)?.to_array_of_size(args.number_rows)
                }
            })
            .collect::<Result<_>>()?;
        let slots = hash_slots(&keys, modulus)?;
        Ok(ColumnarValue::Array(Arc::new(UInt32Array::from(slots))))
    }
}

/// `cirro_hash_slot(m, key, …)`: the slot of `m` the key hashes to.
pub fn hash_slot_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(HashSlot {
            signature: Signature::variadic_any(Volatility::Immutable),
        }))
    });
    Arc::clone(&UDF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray, StringViewArray};

    #[test]
    fn slots_are_repartition_partitions() {
        let keys = Arc::new(Int64Array::from((0..300).collect::<Vec<_>>())) as ArrayRef;
        let mut hashes = vec![0; 300];
        create_hashes(
            std::slice::from_ref(&keys),
            REPARTITION_RANDOM_STATE.random_state(),
            &mut hashes,
        )
        .unwrap();
        let slots = hash_slots(&[keys], 12).unwrap();
        for (hash, slot) in hashes.iter().zip(slots) {
            assert_eq!((hash % 12) as u32, slot);
        }
        let text = vec![Some("a"), None, Some("a much longer string value")];
        assert_eq!(
            hash_slots(&[Arc::new(StringArray::from(text.clone()))], 64).unwrap(),
            hash_slots(&[Arc::new(StringViewArray::from(text))], 64).unwrap()
        );
        assert!(hash_slots(&[], 0).is_err());
    }
}
