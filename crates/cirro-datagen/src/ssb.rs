//! A Star Schema Benchmark generator after the SSB specification (O'Neil,
//! O'Neil, Chen: "Star Schema Benchmark", revision 3).
//!
//! | table     | rows                                      |
//! |-----------|-------------------------------------------|
//! | customer  | 30,000 × SF                               |
//! | part      | 200,000 × ⌊1 + log2 SF⌋ (× SF below SF 1) |
//! | supplier  | 2,000 × SF                                |
//! | dwdate    | 2,556 (1992-01-01 … 1998-12-30, as dbgen) |
//! | lineorder | 1,500,000 × SF orders of 1–7 lines ≈ 6,000,000 × SF |
//!
//! Value distributions follow the specification, so the queries' filter factors
//! come out as it gives them: nations uniform over the 25 TPC-H nations (5 per
//! region), `p_mfgr` uniform over 5, `p_category` over 25, `p_brand1` over
//! 1,000; order dates uniform over the 7 years; quantity 1–50, discount 0–10,
//! tax 0–8. Prices follow dbgen: in cents, `retail(pk) = 90000 + (pk/10 mod
//! 20001) + 100·(pk mod 1000)`, extended price = quantity × retail, supply cost
//! = 0.6 × retail, revenue = extended price × (100 − discount) / 100.
//!
//! The generator is deterministic: the same scale factor gives the same rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Builder, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use chrono::{Datelike, NaiveDate, Weekday};
use cirro_common::limits::LOAD_BATCH_ROWS;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{BatchIter, GeneratedTable};

/// The 25 TPC-H nations and their regions (5 nations per region).
pub const NATIONS: [(&str, &str); 25] = [
    ("ALGERIA", "AFRICA"),
    ("ARGENTINA", "AMERICA"),
    ("BRAZIL", "AMERICA"),
    ("CANADA", "AMERICA"),
    ("EGYPT", "MIDDLE EAST"),
    ("ETHIOPIA", "AFRICA"),
    ("FRANCE", "EUROPE"),
    ("GERMANY", "EUROPE"),
    ("INDIA", "ASIA"),
    ("INDONESIA", "ASIA"),
    ("IRAN", "MIDDLE EAST"),
    ("IRAQ", "MIDDLE EAST"),
    ("JAPAN", "ASIA"),
    ("JORDAN", "MIDDLE EAST"),
    ("KENYA", "AFRICA"),
    ("MOROCCO", "AFRICA"),
    ("MOZAMBIQUE", "AFRICA"),
    ("PERU", "AMERICA"),
    ("CHINA", "ASIA"),
    ("ROMANIA", "EUROPE"),
    ("SAUDI ARABIA", "MIDDLE EAST"),
    ("VIETNAM", "ASIA"),
    ("RUSSIA", "EUROPE"),
    ("UNITED KINGDOM", "EUROPE"),
    ("UNITED STATES", "AMERICA"),
];

const SEGMENTS: [&str; 5] = [
    "AUTOMOBILE",
    "BUILDING",
    "FURNITURE",
    "HOUSEHOLD",
    "MACHINERY",
];
const PRIORITIES: [&str; 5] = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECI", "5-LOW"];
const SHIP_MODES: [&str; 7] = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"];
const COLORS: [&str; 92] = [
    "almond",
    "antique",
    "aquamarine",
    "azure",
    "beige",
    "bisque",
    "black",
    "blanched",
    "blue",
    "blush",
    "brown",
    "burlywood",
    "burnished",
    "chartreuse",
    "chiffon",
    "chocolate",
    "coral",
    "cornflower",
    "cornsilk",
    "cream",
    "cyan",
    "dark",
    "deep",
    "dim",
    "dodger",
    "drab",
    "firebrick",
    "floral",
    "forest",
    "frosted",
    "gainsboro",
    "ghost",
    "goldenrod",
    "green",
    "grey",
    "honeydew",
    "hot",
    "indian",
    "ivory",
    "khaki",
    "lace",
    "lavender",
    "lawn",
    "lemon",
    "light",
    "lime",
    "linen",
    "magenta",
    "maroon",
    "medium",
    "metallic",
    "midnight",
    "mint",
    "misty",
    "moccasin",
    "navajo",
    "navy",
    "olive",
    "orange",
    "orchid",
    "pale",
    "papaya",
    "peach",
    "peru",
    "pink",
    "plum",
    "powder",
    "puff",
    "purple",
    "red",
    "rose",
    "rosy",
    "royal",
    "saddle",
    "salmon",
    "sandy",
    "seashell",
    "sienna",
    "sky",
    "slate",
    "smoke",
    "snow",
    "spring",
    "steel",
    "tan",
    "thistle",
    "tomato",
    "turquoise",
    "violet",
    "wheat",
    "white",
    "yellow",
];
const TYPE_1: [&str; 6] = ["STANDARD", "SMALL", "MEDIUM", "LARGE", "ECONOMY", "PROMO"];
const TYPE_2: [&str; 5] = ["ANODIZED", "BURNISHED", "PLATED", "POLISHED", "BRUSHED"];
const TYPE_3: [&str; 5] = ["TIN", "NICKEL", "BRASS", "STEEL", "COPPER"];
const CONTAINER_1: [&str; 5] = ["SM", "LG", "MED", "JUMBO", "WRAP"];
const CONTAINER_2: [&str; 8] = ["CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM"];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAY_NAMES: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const ADDRESS_CHARS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,. ";

/// First and last day of the date dimension.
fn first_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(1992, 1, 1).unwrap_or_default()
}
pub const DATE_ROWS: u64 = 2556;

/// Row counts of the SSB tables at scale factor `sf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub customer: u64,
    pub part: u64,
    pub supplier: u64,
    pub orders: u64,
}

pub fn counts(sf: f64) -> Counts {
    let scaled = |base: f64| ((base * sf).round() as u64).max(1);
    let part = if sf < 1.0 {
        scaled(200_000.0)
    } else {
        200_000 * (1.0 + sf.log2()).floor() as u64
    };
    Counts {
        customer: scaled(30_000.0),
        part,
        supplier: scaled(2_000.0),
        orders: scaled(1_500_000.0),
    }
}

fn int(name: &str) -> Field {
    Field::new(name, DataType::Int32, false)
}
fn text(name: &str) -> Field {
    Field::new(name, DataType::Utf8, false)
}

pub fn customer_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        int("c_custkey"),
        text("c_name"),
        text("c_address"),
        text("c_city"),
        text("c_nation"),
        text("c_region"),
        text("c_phone"),
        text("c_mktsegment"),
    ]))
}
pub fn supplier_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        int("s_suppkey"),
        text("s_name"),
        text("s_address"),
        text("s_city"),
        text("s_nation"),
        text("s_region"),
        text("s_phone"),
    ]))
}
pub fn part_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        int("p_partkey"),
        text("p_name"),
        Field::new("p_mfgr", DataType::Utf8, true),
        text("p_category"),
        text("p_brand1"),
        text("p_color"),
        text("p_type"),
        int("p_size"),
        text("p_container"),
    ]))
}
pub fn date_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        int("d_datekey"),
        text("d_date"),
        text("d_dayofweek"),
        text("d_month"),
        int("d_year"),
        int("d_yearmonthnum"),
        text("d_yearmonth"),
        int("d_daynuminweek"),
        int("d_daynuminmonth"),
        int("d_daynuminyear"),
        int("d_monthnuminyear"),
        int("d_weeknuminyear"),
        text("d_sellingseason"),
        text("d_lastdayinweekfl"),
        text("d_lastdayinmonthfl"),
        text("d_holidayfl"),
        text("d_weekdayfl"),
    ]))
}
pub fn lineorder_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        int("lo_orderkey"),
        int("lo_linenumber"),
        int("lo_custkey"),
        int("lo_partkey"),
        int("lo_suppkey"),
        int("lo_orderdate"),
        text("lo_orderpriority"),
        text("lo_shippriority"),
        int("lo_quantity"),
        int("lo_extendedprice"),
        int("lo_ordertotalprice"),
        int("lo_discount"),
        int("lo_revenue"),
        int("lo_supplycost"),
        int("lo_tax"),
        int("lo_commitdate"),
        text("lo_shipmode"),
    ]))
}

/// The SSB table names, with the `.tbl` file each is loaded from.
pub const TABLE_FILES: [(&str, &str); 5] = [
    ("customer", "customer.tbl"),
    ("part", "part.tbl"),
    ("supplier", "supplier.tbl"),
    ("dwdate", "date.tbl"),
    ("lineorder", "lineorder.tbl"),
];

pub fn schema_of(table: &str) -> Option<SchemaRef> {
    Some(match table {
        "customer" => customer_schema(),
        "part" => part_schema(),
        "supplier" => supplier_schema(),
        "dwdate" => date_schema(),
        "lineorder" => lineorder_schema(),
        _ => return None,
    })
}

/// Retail price of a part, in cents (TPC-H's formula, as SSB dbgen uses it).
pub fn retail_price_cents(partkey: i64) -> i64 {
    90_000 + (partkey / 10) % 20_001 + 100 * (partkey % 1_000)
}

fn random_address(rng: &mut StdRng) -> String {
    let len = rng.random_range(10..=25);
    (0..len)
        .map(|_| ADDRESS_CHARS[rng.random_range(0..ADDRESS_CHARS.len())] as char)
        .collect()
}

fn city(nation: &str, digit: u32) -> String {
    let prefix: String = nation.chars().take(9).collect();
    format!("{prefix:<9}{digit}")
}

fn phone(rng: &mut StdRng, nation: usize) -> String {
    format!(
        "{}-{:03}-{:03}-{:04}",
        nation + 10,
        rng.random_range(100..1000),
        rng.random_range(100..1000),
        rng.random_range(1000..10000)
    )
}

/// Batches of `rows` rows made by `fill(first_row_index, row_count)`.
fn batches<F>(rows: u64, mut fill: F) -> BatchIter
where
    F: FnMut(u64, usize) -> Result<RecordBatch, ArrowError> + Send + 'static,
{
    let step = LOAD_BATCH_ROWS as u64;
    Box::new((0..rows.div_ceil(step)).map(move |i| {
        let start = i * step;
        fill(start, (rows - start).min(step) as usize)
    }))
}

/// Customers and suppliers: a key, then name, address, city, nation, region
/// and phone, made the same way; customers add a market segment.
fn party_batches(count: u64, seed: u64, label: &'static str, segment: bool) -> BatchIter {
    let mut rng = StdRng::seed_from_u64(seed);
    let schema = if segment {
        customer_schema()
    } else {
        supplier_schema()
    };
    batches(count, move |start, n| {
        let text_columns = if segment { 7 } else { 6 };
        let mut cols: Vec<StringBuilder> =
            (0..text_columns).map(|_| StringBuilder::new()).collect();
        let mut key = Int32Builder::with_capacity(n);
        for i in 0..n {
            let k = start + i as u64 + 1;
            let nation = rng.random_range(0..25);
            let (nation_name, region) = NATIONS[nation];
            key.append_value(k as i32);
            cols[0].append_value(format!("{label}#{k:09}"));
            cols[1].append_value(random_address(&mut rng));
            cols[2].append_value(city(nation_name, rng.random_range(0..10)));
            cols[3].append_value(nation_name);
            cols[4].append_value(region);
            cols[5].append_value(phone(&mut rng, nation));
            if segment {
                cols[6].append_value(SEGMENTS[rng.random_range(0..5)]);
            }
        }
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(key.finish())];
        arrays.extend(cols.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        RecordBatch::try_new(Arc::clone(&schema), arrays)
    })
}

fn customer_batches(count: u64) -> BatchIter {
    party_batches(count, 0x55B_C, "Customer", true)
}

fn supplier_batches(count: u64) -> BatchIter {
    party_batches(count, 0x55B_5, "Supplier", false)
}

fn part_batches(count: u64) -> BatchIter {
    let mut rng = StdRng::seed_from_u64(0x55B_9);
    batches(count, move |start, n| {
        let mut key = Int32Builder::with_capacity(n);
        let mut size = Int32Builder::with_capacity(n);
        let mut cols: Vec<StringBuilder> = (0..7).map(|_| StringBuilder::new()).collect();
        for i in 0..n {
            let k = start + i as u64 + 1;
            let mfgr = rng.random_range(1..=5);
            let category = rng.random_range(1..=5);
            let brand = rng.random_range(1..=40);
            key.append_value(k as i32);
            let c1 = COLORS[rng.random_range(0..COLORS.len())];
            let c2 = COLORS[rng.random_range(0..COLORS.len())];
            cols[0].append_value(format!("{c1} {c2}"));
            cols[1].append_value(format!("MFGR#{mfgr}"));
            cols[2].append_value(format!("MFGR#{mfgr}{category}"));
            cols[3].append_value(format!("MFGR#{mfgr}{category}{brand}"));
            cols[4].append_value(COLORS[rng.random_range(0..COLORS.len())]);
            cols[5].append_value(format!(
                "{} {} {}",
                TYPE_1[rng.random_range(0..6)],
                TYPE_2[rng.random_range(0..5)],
                TYPE_3[rng.random_range(0..5)]
            ));
            size.append_value(rng.random_range(1..=50));
            cols[6].append_value(format!(
                "{} {}",
                CONTAINER_1[rng.random_range(0..5)],
                CONTAINER_2[rng.random_range(0..8)]
            ));
        }
        let c: Vec<ArrayRef> = cols
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef)
            .collect();
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(key.finish()),
            c[0].clone(),
            c[1].clone(),
            c[2].clone(),
            c[3].clone(),
            c[4].clone(),
            c[5].clone(),
            Arc::new(size.finish()),
            c[6].clone(),
        ];
        RecordBatch::try_new(part_schema(), arrays)
    })
}

fn date_key(day: NaiveDate) -> i32 {
    day.year() * 10_000 + day.month() as i32 * 100 + day.day() as i32
}

fn season(month: u32, day: u32) -> &'static str {
    match month {
        12 if day >= 1 => "Christmas",
        1 | 2 => "Winter",
        3..=5 => "Spring",
        6..=8 => "Summer",
        _ => "Fall",
    }
}

fn is_holiday(month: u32, day: u32) -> bool {
    matches!(
        (month, day),
        (1, 1) | (7, 4) | (12, 24) | (12, 25) | (12, 31) | (11, 11)
    )
}

fn date_batches() -> BatchIter {
    batches(DATE_ROWS, |start, n| {
        let mut ints: Vec<Int32Builder> = (0..8).map(|_| Int32Builder::with_capacity(n)).collect();
        let mut texts: Vec<StringBuilder> = (0..9).map(|_| StringBuilder::new()).collect();
        for i in 0..n {
            let day = first_day() + chrono::Days::new(start + i as u64);
            let (month, dom) = (day.month(), day.day());
            let next = day + chrono::Days::new(1);
            let weekday = day.weekday();
            ints[0].append_value(date_key(day));
            texts[0].append_value(format!(
                "{} {}, {}",
                MONTHS[month as usize - 1],
                dom,
                day.year()
            ));
            texts[1].append_value(DAY_NAMES[weekday.num_days_from_sunday() as usize]);
            texts[2].append_value(MONTHS[month as usize - 1]);
            ints[1].append_value(day.year());
            ints[2].append_value(day.year() * 100 + month as i32);
            texts[3].append_value(format!(
                "{}{}",
                &MONTHS[month as usize - 1][..3],
                day.year()
            ));
            ints[3].append_value(weekday.num_days_from_sunday() as i32 + 1);
            ints[4].append_value(dom as i32);
            ints[5].append_value(day.ordinal() as i32);
            ints[6].append_value(month as i32);
            ints[7].append_value(day.iso_week().week() as i32);
            texts[4].append_value(season(month, dom));
            texts[5].append_value(if weekday == Weekday::Sat { "1" } else { "0" });
            texts[6].append_value(if next.month() != month { "1" } else { "0" });
            texts[7].append_value(if is_holiday(month, dom) { "1" } else { "0" });
            texts[8].append_value(if weekday.num_days_from_monday() < 5 {
                "1"
            } else {
                "0"
            });
        }
        let mut i = ints.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut t = texts.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut next_int = || {
            i.next()
                .ok_or_else(|| ArrowError::ComputeError("date column".into()))
        };
        let mut next_text = || {
            t.next()
                .ok_or_else(|| ArrowError::ComputeError("date column".into()))
        };
        let arrays = vec![
            next_int()?,
            next_text()?,
            next_text()?,
            next_text()?,
            next_int()?,
            next_int()?,
            next_text()?,
            next_int()?,
            next_int()?,
            next_int()?,
            next_int()?,
            next_int()?,
            next_text()?,
            next_text()?,
            next_text()?,
            next_text()?,
            next_text()?,
        ];
        RecordBatch::try_new(date_schema(), arrays)
    })
}

/// Lineorder rows are made order by order; an order's lines share its key,
/// customer, date and priority, and its total price.
struct LineorderGenerator {
    rng: StdRng,
    counts: Counts,
    next_order: u64,
    pending: Vec<[i32; 15]>,
    pending_text: Vec<(usize, usize)>,
}

impl LineorderGenerator {
    fn new(counts: Counts) -> Self {
        Self {
            rng: StdRng::seed_from_u64(0x55B_10),
            counts,
            next_order: 1,
            pending: Vec::new(),
            pending_text: Vec::new(),
        }
    }

    /// Append one order's lines to `pending`.
    fn order(&mut self) {
        let rng = &mut self.rng;
        let key = self.next_order as i32;
        self.next_order += 1;
        let customer = rng.random_range(1..=self.counts.customer) as i32;
        let day = first_day() + chrono::Days::new(rng.random_range(0..DATE_ROWS));
        let order_date = date_key(day);
        let priority = rng.random_range(0..PRIORITIES.len());
        let lines = rng.random_range(1..=7);
        let first = self.pending.len();
        let mut total: i64 = 0;
        for line in 1..=lines {
            let part = rng.random_range(1..=self.counts.part) as i64;
            let supplier = rng.random_range(1..=self.counts.supplier) as i32;
            let quantity: i64 = rng.random_range(1..=50);
            let discount: i64 = rng.random_range(0..=10);
            let tax: i64 = rng.random_range(0..=8);
            let retail = retail_price_cents(part);
            let extended = quantity * retail;
            let revenue = extended * (100 - discount) / 100;
            let supply_cost = retail * 6 / 10;
            total += extended * (100 + tax) / 100 * (100 - discount) / 100;
            let commit = date_key(day + chrono::Days::new(rng.random_range(30..=90)));
            self.pending.push([
                key,
                line,
                customer,
                part as i32,
                supplier,
                order_date,
                quantity as i32,
                extended as i32,
                0,
                discount as i32,
                revenue as i32,
                supply_cost as i32,
                tax as i32,
                commit,
                0,
            ]);
            self.pending_text
                .push((priority, rng.random_range(0..SHIP_MODES.len())));
        }
        let total = total.min(i32::MAX as i64) as i32;
        for row in &mut self.pending[first..] {
            row[8] = total;
        }
    }

    fn batch(&mut self) -> Option<Result<RecordBatch, ArrowError>> {
        while self.pending.len() < LOAD_BATCH_ROWS && self.next_order <= self.counts.orders {
            self.order();
        }
        if self.pending.is_empty() {
            return None;
        }
        let take = self.pending.len().min(LOAD_BATCH_ROWS);
        let rows: Vec<[i32; 15]> = self.pending.drain(..take).collect();
        let texts: Vec<(usize, usize)> = self.pending_text.drain(..take).collect();
        let int_col = |i: usize| -> ArrayRef {
            Arc::new(arrow::array::Int32Array::from_iter_values(
                rows.iter().map(|r| r[i]),
            ))
        };
        let priorities: ArrayRef = Arc::new(arrow::array::StringArray::from_iter_values(
            texts.iter().map(|t| PRIORITIES[t.0]),
        ));
        let ship_priority: ArrayRef = Arc::new(arrow::array::StringArray::from_iter_values(
            texts.iter().map(|_| "0"),
        ));
        let modes: ArrayRef = Arc::new(arrow::array::StringArray::from_iter_values(
            texts.iter().map(|t| SHIP_MODES[t.1]),
        ));
        let arrays = vec![
            int_col(0),
            int_col(1),
            int_col(2),
            int_col(3),
            int_col(4),
            int_col(5),
            priorities,
            ship_priority,
            int_col(6),
            int_col(7),
            int_col(8),
            int_col(9),
            int_col(10),
            int_col(11),
            int_col(12),
            int_col(13),
            modes,
        ];
        Some(RecordBatch::try_new(lineorder_schema(), arrays))
    }
}

/// The five SSB tables at scale factor `sf`.
pub fn tables(sf: f64) -> Vec<GeneratedTable> {
    let c = counts(sf);
    vec![
        GeneratedTable {
            name: "customer",
            schema: customer_schema(),
            rows_estimate: c.customer,
            batches: Box::new(move || customer_batches(c.customer)),
        },
        GeneratedTable {
            name: "part",
            schema: part_schema(),
            rows_estimate: c.part,
            batches: Box::new(move || part_batches(c.part)),
        },
        GeneratedTable {
            name: "supplier",
            schema: supplier_schema(),
            rows_estimate: c.supplier,
            batches: Box::new(move || supplier_batches(c.supplier)),
        },
        GeneratedTable {
            name: "dwdate",
            schema: date_schema(),
            rows_estimate: DATE_ROWS,
            batches: Box::new(date_batches),
        },
        GeneratedTable {
            name: "lineorder",
            schema: lineorder_schema(),
            rows_estimate: c.orders * 4,
            batches: Box::new(move || {
                let mut generator = LineorderGenerator::new(c);
                Box::new(std::iter::from_fn(move || generator.batch()))
            }),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_specification() {
        assert_eq!(
            counts(1.0),
            Counts {
                customer: 30_000,
                part: 200_000,
                supplier: 2_000,
                orders: 1_500_000
            }
        );
        assert_eq!(counts(10.0).part, 200_000 * 4);
        assert_eq!(counts(0.01).part, 2_000);
    }

    #[test]
    fn retail_price_matches_dbgen() {
        // From ../shared/ssb/data-sf0.01: part 1552 with quantity 17 has extended price 2471035.
        assert_eq!(17 * retail_price_cents(1552), 2_471_035);
        assert_eq!(retail_price_cents(1552) * 6 / 10, 87_213);
    }

    #[test]
    fn date_table_covers_seven_years() {
        let rows: usize = date_batches().map(|b| b.expect("batch").num_rows()).sum();
        assert_eq!(rows as u64, DATE_ROWS);
        let last = first_day() + chrono::Days::new(DATE_ROWS - 1);
        // As in dbgen, the 2,556 days end on 1998-12-30.
        assert_eq!(date_key(last), 19981230);
    }

    #[test]
    fn generator_is_deterministic_and_lines_average_four() {
        let run = || -> (usize, i64) {
            let t = tables(0.01).pop().expect("lineorder");
            let mut rows = 0;
            let mut sum = 0i64;
            for b in (t.batches)() {
                let b = b.expect("batch");
                rows += b.num_rows();
                let col = b
                    .column(9)
                    .as_any()
                    .downcast_ref::<arrow::array::Int32Array>()
                    .expect("int");
                sum += col.iter().flatten().map(i64::from).sum::<i64>();
            }
            (rows, sum)
        };
        let (rows, sum) = run();
        assert_eq!(run(), (rows, sum));
        let per_order = rows as f64 / 15_000.0;
        assert!((3.8..4.2).contains(&per_order), "{per_order}");
    }
}
