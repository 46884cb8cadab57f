//! TPC-H tables from `tpchgen` / `tpchgen-arrow`.

use cirro_common::limits::LOAD_BATCH_ROWS;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow, RegionArrow,
    SupplierArrow,
};

use crate::{BatchIter, GeneratedTable};

fn scaled(base: f64, sf: f64) -> u64 {
    (base * sf).round().max(1.0) as u64
}

/// The eight TPC-H tables at scale factor `sf`.
pub fn tables(sf: f64) -> Vec<GeneratedTable> {
    let batch = LOAD_BATCH_ROWS;
    vec![
        GeneratedTable {
            name: "region",
            schema: RegionArrow::schema_ref(),
            rows_estimate: 5,
            batches: Box::new(move || -> BatchIter {
                Box::new(RegionArrow::new(RegionGenerator::new(sf, 1, 1)).with_batch_size(batch))
            }),
        },
        GeneratedTable {
            name: "nation",
            schema: NationArrow::schema_ref(),
            rows_estimate: 25,
            batches: Box::new(move || -> BatchIter {
                Box::new(NationArrow::new(NationGenerator::new(sf, 1, 1)).with_batch_size(batch))
            }),
        },
        GeneratedTable {
            name: "supplier",
            schema: SupplierArrow::schema_ref(),
            rows_estimate: SupplierGenerator::calculate_row_count(sf, 1, 1) as u64,
            batches: Box::new(move || -> BatchIter {
                Box::new(
                    SupplierArrow::new(SupplierGenerator::new(sf, 1, 1)).with_batch_size(batch),
                )
            }),
        },
        GeneratedTable {
            name: "customer",
            schema: CustomerArrow::schema_ref(),
            rows_estimate: CustomerGenerator::calculate_row_count(sf, 1, 1) as u64,
            batches: Box::new(move || -> BatchIter {
                Box::new(
                    CustomerArrow::new(CustomerGenerator::new(sf, 1, 1)).with_batch_size(batch),
                )
            }),
        },
        GeneratedTable {
            name: "part",
            schema: PartArrow::schema_ref(),
            rows_estimate: PartGenerator::calculate_row_count(sf, 1, 1) as u64,
            batches: Box::new(move || -> BatchIter {
                Box::new(PartArrow::new(PartGenerator::new(sf, 1, 1)).with_batch_size(batch))
            }),
        },
        GeneratedTable {
            name: "partsupp",
            schema: PartSuppArrow::schema_ref(),
            rows_estimate: PartGenerator::calculate_row_count(sf, 1, 1) as u64 * 4,
            batches: Box::new(move || -> BatchIter {
                Box::new(
                    PartSuppArrow::new(PartSuppGenerator::new(sf, 1, 1)).with_batch_size(batch),
                )
            }),
        },
        GeneratedTable {
            name: "orders",
            schema: OrderArrow::schema_ref(),
            rows_estimate: scaled(1_500_000.0, sf),
            batches: Box::new(move || -> BatchIter {
                Box::new(OrderArrow::new(OrderGenerator::new(sf, 1, 1)).with_batch_size(batch))
            }),
        },
        GeneratedTable {
            name: "lineitem",
            schema: LineItemArrow::schema_ref(),
            rows_estimate: scaled(6_001_215.0, sf),
            batches: Box::new(move || -> BatchIter {
                Box::new(
                    LineItemArrow::new(LineItemGenerator::new(sf, 1, 1)).with_batch_size(batch),
                )
            }),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_scale_row_counts_match_dbgen() {
        let counts: Vec<(&str, usize)> = tables(0.01)
            .into_iter()
            .map(|t| {
                let rows = (t.batches)().map(|b| b.expect("batch").num_rows()).sum();
                (t.name, rows)
            })
            .collect();
        let expected = [
            ("region", 5),
            ("nation", 25),
            ("supplier", 100),
            ("customer", 1500),
            ("part", 2000),
            ("partsupp", 8000),
            ("orders", 15000),
            ("lineitem", 60175),
        ];
        assert_eq!(counts, expected);
    }
}
