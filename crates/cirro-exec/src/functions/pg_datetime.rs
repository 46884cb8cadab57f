//! `to_char`, `to_date` and `to_timestamp` with PostgreSQL's template
//! patterns (`YYYY-MM-DD HH24:MI:SS`, `FMDay, DD Mon YYYY`), where
//! DataFusion's take chrono's `%Y-%m-%d` (and returned a PostgreSQL pattern
//! unchanged), and `to_timestamp(seconds)` with PostgreSQL's range check
//! (22008) where DataFusion's saturated.
//!
//! A template is read once into [`Field`]s: the patterns of PostgreSQL's
//! table 9.27 Cirro supports (years, months, days, day names, hours,
//! minutes, seconds, fractions, AM/PM, quarter, ISO week, day of year),
//! with the `FM` prefix (no padding) and the `TH`/`th` suffix (ordinals);
//! text in double quotes and every other character are literal. Formatting
//! writes each field; parsing reads each field from the text (numbers up to
//! the field's width, names case-insensitively; a literal in the template
//! skips one character of the text), then checks the date (22008).

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, Date32Array, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, TimeUnit};
use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};
use cirro_common::{CirroError, SqlState};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Microseconds of a Timestamp(µs) that PostgreSQL's range admits and Arrow
/// holds: up to 294246-12-31, the end of i64 microseconds.
const EPOCH_SECONDS_MAX: f64 = 9_223_372_036_854.0;

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
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Upper,
    Title,
    Lower,
}

#[derive(Debug, Clone, PartialEq)]
enum Pattern {
    Year4,
    Year3,
    Year2,
    Year1,
    Month,
    MonthName(Case),
    MonthAbbrev(Case),
    Day,
    DayOfYear,
    DayOfWeek,
    DayName(Case),
    DayAbbrev(Case),
    Hour24,
    Hour12,
    Minute,
    Second,
    Millisecond,
    Microsecond,
    Meridiem { upper: bool, dots: bool },
    Quarter,
    IsoWeek,
    IsoYear,
    SecondsOfDay,
    Literal(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    pattern: Pattern,
    /// `FM`: no padding.
    fill_mode: bool,
    /// `TH` / `th`: an ordinal suffix (upper case or not).
    ordinal: Option<bool>,
}

/// The patterns by their spelling, longest first (PostgreSQL's order).
fn patterns() -> &'static [(&'static str, Pattern)] {
    use Case::*;
    use Pattern::*;
    static TABLE: LazyLock<Vec<(&'static str, Pattern)>> = LazyLock::new(|| {
        vec![
            (
                "A.M.",
                Meridiem {
                    upper: true,
                    dots: true,
                },
            ),
            (
                "P.M.",
                Meridiem {
                    upper: true,
                    dots: true,
                },
            ),
            (
                "a.m.",
                Meridiem {
                    upper: false,
                    dots: true,
                },
            ),
            (
                "p.m.",
                Meridiem {
                    upper: false,
                    dots: true,
                },
            ),
            ("SSSSS", SecondsOfDay),
            ("SSSS", SecondsOfDay),
            ("MONTH", MonthName(Upper)),
            ("Month", MonthName(Title)),
            ("month", MonthName(Lower)),
            ("HH24", Hour24),
            ("HH12", Hour12),
            ("YYYY", Year4),
            ("yyyy", Year4),
            ("IYYY", IsoYear),
            ("YYY", Year3),
            ("yyy", Year3),
            ("MON", MonthAbbrev(Upper)),
            ("Mon", MonthAbbrev(Title)),
            ("mon", MonthAbbrev(Lower)),
            ("DAY", DayName(Upper)),
            ("Day", DayName(Title)),
            ("day", DayName(Lower)),
            ("DDD", DayOfYear),
            ("ddd", DayOfYear),
            ("YY", Year2),
            ("yy", Year2),
            ("MM", Month),
            ("mm", Month),
            ("DD", Day),
            ("dd", Day),
            ("DY", DayAbbrev(Upper)),
            ("Dy", DayAbbrev(Title)),
            ("dy", DayAbbrev(Lower)),
            ("HH", Hour12),
            ("hh", Hour12),
            ("MI", Minute),
            ("mi", Minute),
            ("SS", Second),
            ("ss", Second),
            ("MS", Millisecond),
            ("ms", Millisecond),
            ("US", Microsecond),
            ("us", Microsecond),
            (
                "AM",
                Meridiem {
                    upper: true,
                    dots: false,
                },
            ),
            (
                "PM",
                Meridiem {
                    upper: true,
                    dots: false,
                },
            ),
            (
                "am",
                Meridiem {
                    upper: false,
                    dots: false,
                },
            ),
            (
                "pm",
                Meridiem {
                    upper: false,
                    dots: false,
                },
            ),
            ("IW", IsoWeek),
            ("iw", IsoWeek),
            ("Y", Year1),
            ("y", Year1),
            ("D", DayOfWeek),
            ("d", DayOfWeek),
            ("Q", Quarter),
            ("q", Quarter),
        ]
    });
    &TABLE
}

/// Read a template into its fields.
fn parse_template(template: &str) -> Vec<Field> {
    let mut fields = Vec::new();
    let mut rest = template;
    let mut literal = String::new();
    let flush = |literal: &mut String, fields: &mut Vec<Field>| {
        if !literal.is_empty() {
            fields.push(Field {
                pattern: Pattern::Literal(std::mem::take(literal)),
                fill_mode: false,
                ordinal: None,
            });
        }
    };
    while !rest.is_empty() {
        let fill_mode = rest.starts_with("FM") || rest.starts_with("fm");
        let body = if fill_mode { &rest[2..] } else { rest };
        if let Some((spelling, pattern)) = patterns().iter().find(|(s, _)| body.starts_with(s)) {
            flush(&mut literal, &mut fields);
            let mut after = &body[spelling.len()..];
            let ordinal = if after.starts_with("TH") {
                after = &after[2..];
                Some(true)
            } else if after.starts_with("th") {
                after = &after[2..];
                Some(false)
            } else {
                None
            };
            fields.push(Field {
                pattern: pattern.clone(),
                fill_mode,
                ordinal,
            });
            rest = after;
            continue;
        }
        let mut chars = rest.chars();
        match chars.next() {
            Some('"') => {
                // Quoted text, `\"` for a quote inside.
                let mut text = chars.as_str();
                while let Some(c) = text.chars().next() {
                    text = &text[c.len_utf8()..];
                    match c {
                        '"' => break,
                        '\\' if text.starts_with('"') => {
                            literal.push('"');
                            text = &text[1..];
                        }
                        c => literal.push(c),
                    }
                }
                rest = text;
            }
            Some('\\') if chars.as_str().starts_with('"') => {
                literal.push('"');
                rest = &chars.as_str()[1..];
            }
            Some(c) => {
                literal.push(c);
                rest = chars.as_str();
            }
            None => break,
        }
    }
    flush(&mut literal, &mut fields);
    fields
}

fn ordinal_suffix(n: i64, upper: bool) -> &'static str {
    let suffix = match (n % 100, n % 10) {
        (11..=13, _) => "th",
        (_, 1) => "st",
        (_, 2) => "nd",
        (_, 3) => "rd",
        _ => "th",
    };
    if upper {
        match suffix {
            "st" => "ST",
            "nd" => "ND",
            "rd" => "RD",
            _ => "TH",
        }
    } else {
        suffix
    }
}

fn cased(name: &str, case: Case) -> String {
    match case {
        Case::Upper => name.to_uppercase(),
        Case::Title => name.to_string(),
        Case::Lower => name.to_lowercase(),
    }
}

/// `at` written by the template's fields.
fn format_datetime(at: &NaiveDateTime, fields: &[Field]) -> String {
    use Pattern::*;
    let mut out = String::new();
    for field in fields {
        let number = |out: &mut String, value: i64, width: usize| {
            if field.fill_mode {
                out.push_str(&value.to_string());
            } else if value < 0 {
                out.push_str(&format!("-{:0width$}", -value, width = width));
            } else {
                out.push_str(&format!("{value:0width$}"));
            }
            if let Some(upper) = field.ordinal {
                out.push_str(ordinal_suffix(value, upper));
            }
        };
        let name = |out: &mut String, text: String, pad: usize| {
            if field.fill_mode {
                out.push_str(&text);
            } else {
                out.push_str(&format!("{text:<pad$}"));
            }
        };
        let hour12 = match at.hour() % 12 {
            0 => 12,
            h => h,
        } as i64;
        match &field.pattern {
            Year4 => number(&mut out, at.year() as i64, 4),
            Year3 => number(&mut out, (at.year() % 1000) as i64, 3),
            Year2 => number(&mut out, (at.year() % 100) as i64, 2),
            Year1 => number(&mut out, (at.year() % 10) as i64, 1),
            IsoYear => number(&mut out, at.iso_week().year() as i64, 4),
            Month => number(&mut out, at.month() as i64, 2),
            MonthName(case) => name(&mut out, cased(MONTHS[at.month0() as usize], *case), 9),
            MonthAbbrev(case) => out.push_str(&cased(&MONTHS[at.month0() as usize][..3], *case)),
            Day => number(&mut out, at.day() as i64, 2),
            DayOfYear => number(&mut out, at.ordinal() as i64, 3),
            DayOfWeek => number(&mut out, at.weekday().num_days_from_sunday() as i64 + 1, 1),
            DayName(case) => name(
                &mut out,
                cased(DAYS[at.weekday().num_days_from_sunday() as usize], *case),
                9,
            ),
            DayAbbrev(case) => out.push_str(&cased(
                &DAYS[at.weekday().num_days_from_sunday() as usize][..3],
                *case,
            )),
            Hour24 => number(&mut out, at.hour() as i64, 2),
            Hour12 => number(&mut out, hour12, 2),
            Minute => number(&mut out, at.minute() as i64, 2),
            Second => number(&mut out, at.second() as i64, 2),
            Millisecond => number(&mut out, (at.nanosecond() / 1_000_000) as i64, 3),
            Microsecond => number(&mut out, (at.nanosecond() / 1_000) as i64, 6),
            SecondsOfDay => number(&mut out, at.num_seconds_from_midnight() as i64, 1),
            Quarter => number(&mut out, at.month0() as i64 / 3 + 1, 1),
            IsoWeek => number(&mut out, at.iso_week().week() as i64, 2),
            Meridiem { upper, dots } => {
                let pm = at.hour() >= 12;
                let text = match (pm, dots) {
                    (false, false) => "AM",
                    (true, false) => "PM",
                    (false, true) => "A.M.",
                    (true, true) => "P.M.",
                };
                out.push_str(&if *upper {
                    text.to_string()
                } else {
                    text.to_lowercase()
                });
            }
            Literal(text) => out.push_str(text),
        }
    }
    out
}

fn invalid_value(text: &str, pattern: &str) -> CirroError {
    CirroError::new(
        SqlState::INVALID_DATETIME_FORMAT,
        format!("invalid value \"{text}\" for \"{pattern}\""),
    )
}

fn out_of_range() -> CirroError {
    CirroError::new(
        SqlState::DATETIME_FIELD_OVERFLOW,
        "date/time field value out of range",
    )
}

/// The date and time `text` spells by the template's fields.
fn parse_datetime(text: &str, fields: &[Field]) -> Result<NaiveDateTime, CirroError> {
    use Pattern::*;
    let (mut year, mut month, mut day) = (None::<i64>, None::<i64>, None::<i64>);
    let (mut day_of_year, mut hour, mut minute, mut second) = (None::<i64>, 0i64, 0i64, 0i64);
    let (mut micros, mut pm, mut twelve) = (0i64, None::<bool>, false);
    let mut rest = text;
    for (i, field) in fields.iter().enumerate() {
        let last = i + 1 == fields.len();
        let mut digits = |width: usize, what: &str| -> Result<i64, CirroError> {
            rest = rest.trim_start();
            let negative = rest.starts_with('-');
            let body = if negative { &rest[1..] } else { rest };
            let width = if field.fill_mode || last {
                usize::MAX
            } else {
                width
            };
            let end = body
                .char_indices()
                .take_while(|(n, c)| *n < width && c.is_ascii_digit())
                .map(|(n, c)| n + c.len_utf8())
                .last()
                .unwrap_or(0);
            if end == 0 {
                return Err(invalid_value(
                    rest.split_whitespace().next().unwrap_or(""),
                    what,
                ));
            }
            let value: i64 = body[..end]
                .parse()
                .map_err(|_| invalid_value(&body[..end], what))?;
            rest = &body[end..];
            if field.ordinal.is_some() && rest.len() >= 2 {
                rest = &rest[2..];
            }
            Ok(if negative { -value } else { value })
        };
        match &field.pattern {
            Year4 | IsoYear => year = Some(digits(4, "YYYY")?),
            Year3 => year = Some(2000 + digits(3, "YYY")?),
            Year2 => {
                let y = digits(2, "YY")?;
                year = Some(if y < 70 { 2000 + y } else { 1900 + y });
            }
            Year1 => year = Some(2000 + digits(1, "Y")?),
            Month => month = Some(digits(2, "MM")?),
            Day => day = Some(digits(2, "DD")?),
            DayOfYear => day_of_year = Some(digits(3, "DDD")?),
            Hour24 => hour = digits(2, "HH24")?,
            Hour12 => {
                hour = digits(2, "HH12")?;
                twelve = true;
            }
            Minute => minute = digits(2, "MI")?,
            Second => second = digits(2, "SS")?,
            Millisecond => micros = digits(3, "MS")? * 1000,
            Microsecond => micros = digits(6, "US")?,
            SecondsOfDay => {
                let s = digits(5, "SSSS")?;
                hour = s / 3600;
                minute = s / 60 % 60;
                second = s % 60;
            }
            Quarter | DayOfWeek | IsoWeek => {
                digits(2, "D")?;
            }
            MonthName(_) | MonthAbbrev(_) => {
                rest = rest.trim_start();
                let found = MONTHS.iter().enumerate().find_map(|(n, name)| {
                    let full = matches!(field.pattern, MonthName(_));
                    let name = if full { *name } else { &name[..3] };
                    (rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name))
                        .then_some((n, name.len()))
                });
                let (n, len) = found.ok_or_else(|| {
                    invalid_value(rest.split_whitespace().next().unwrap_or(""), "Month")
                })?;
                month = Some(n as i64 + 1);
                rest = &rest[len..];
            }
            DayName(_) | DayAbbrev(_) => {
                rest = rest.trim_start();
                let full = matches!(field.pattern, DayName(_));
                let found = DAYS.iter().find_map(|name| {
                    let name = if full { *name } else { &name[..3] };
                    (rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name))
                        .then_some(name.len())
                });
                let len = found.ok_or_else(|| {
                    invalid_value(rest.split_whitespace().next().unwrap_or(""), "Day")
                })?;
                rest = &rest[len..];
            }
            Meridiem { dots, .. } => {
                rest = rest.trim_start();
                let len = if *dots { 4 } else { 2 };
                let word = rest.get(..len).unwrap_or(rest).to_ascii_uppercase();
                pm = Some(match word.as_str() {
                    "AM" | "A.M." => false,
                    "PM" | "P.M." => true,
                    _ => return Err(invalid_value(&word, "AM")),
                });
                rest = rest.get(len..).unwrap_or("");
            }
            Literal(literal) => {
                for expected in literal.chars() {
                    let Some(c) = rest.chars().next() else { break };
                    // A space in the template takes any run of spaces.
                    if expected == ' ' {
                        rest = rest.trim_start();
                        continue;
                    }
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
    }
    if twelve || pm.is_some() {
        if !(1..=12).contains(&hour) {
            return Err(CirroError::new(
                SqlState::INVALID_DATETIME_FORMAT,
                format!("hour \"{hour}\" is invalid for the 12-hour clock"),
            ));
        }
        hour %= 12;
        if pm == Some(true) {
            hour += 12;
        }
    }
    let year = year.unwrap_or(1);
    let date = match day_of_year {
        Some(doy) if month.is_none() && day.is_none() => {
            NaiveDate::from_yo_opt(year as i32, doy as u32)
        }
        _ => NaiveDate::from_ymd_opt(
            year as i32,
            month.unwrap_or(1) as u32,
            day.unwrap_or(1) as u32,
        ),
    }
    .ok_or_else(out_of_range)?;
    let time = chrono::NaiveTime::from_hms_micro_opt(
        hour as u32,
        minute as u32,
        second as u32,
        micros as u32,
    )
    .ok_or_else(out_of_range)?;
    Ok(NaiveDateTime::new(date, time))
}

fn to_datafusion(e: CirroError) -> datafusion::error::DataFusionError {
    e.into_datafusion()
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
}

/// Run `f` over each row of the arguments (as arrays), keeping a scalar
/// result for scalar arguments.
fn rowwise(
    args: &[ColumnarValue],
    f: impl Fn(&[ArrayRef]) -> Result<ArrayRef>,
) -> Result<ColumnarValue> {
    let scalars = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let arrays = ColumnarValue::values_to_arrays(args)?;
    let out = f(&arrays)?;
    Ok(if scalars {
        ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
    } else {
        ColumnarValue::Array(out)
    })
}

/// The text values of a (cast to Utf8) column.
fn texts(array: &ArrayRef) -> Result<ArrayRef> {
    Ok(arrow::compute::cast(array, &DataType::Utf8)?)
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ToChar {
    signature: Signature,
}

impl ScalarUDFImpl for ToChar {
    fn name(&self) -> &str {
        "to_char"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        match args {
            [DataType::Date32, t] if is_text(t) || t == &DataType::Null => {
                Ok(vec![DataType::Date32, DataType::Utf8])
            }
            [DataType::Timestamp(_, tz), t] if is_text(t) || t == &DataType::Null => Ok(vec![
                DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
                DataType::Utf8,
            ]),
            [DataType::Null, _] => Ok(vec![
                DataType::Timestamp(TimeUnit::Microsecond, None),
                DataType::Utf8,
            ]),
            [t, _] if t.is_numeric() => Err(CirroError::unsupported(
                "to_char of a number is not supported yet (only of dates and timestamps)",
            )
            .into_datafusion()),
            _ => Err(CirroError::new(
                SqlState::UNDEFINED_FUNCTION,
                format!(
                    "function to_char({}) does not exist",
                    args.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .into_datafusion()),
        }
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        rowwise(&args.args, |arrays| {
            let templates = texts(&arrays[1])?;
            let templates = templates.as_string::<i32>();
            let value_at = |i: usize| -> Option<NaiveDateTime> {
                let column = &arrays[0];
                if column.is_null(i) {
                    return None;
                }
                match column.data_type() {
                    DataType::Date32 => column
                        .as_any()
                        .downcast_ref::<Date32Array>()?
                        .value_as_datetime(i),
                    _ => column
                        .as_any()
                        .downcast_ref::<TimestampMicrosecondArray>()?
                        .value_as_datetime(i),
                }
            };
            let mut cached: Option<(String, Vec<Field>)> = None;
            let out: StringArray = (0..arrays[0].len())
                .map(|i| {
                    if templates.is_null(i) {
                        return None;
                    }
                    let template = templates.value(i);
                    if cached.as_ref().is_none_or(|(t, _)| t != template) {
                        cached = Some((template.to_string(), parse_template(template)));
                    }
                    let fields = &cached.as_ref()?.1;
                    value_at(i).map(|at| format_datetime(&at, fields))
                })
                .collect();
            Ok(Arc::new(out))
        })
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ToDateTime {
    signature: Signature,
    /// `to_timestamp` (else `to_date`).
    timestamp: bool,
}

fn seconds_to_micros(seconds: f64) -> Result<i64, CirroError> {
    if seconds.is_nan() {
        return Err(CirroError::new(
            SqlState::DATETIME_FIELD_OVERFLOW,
            "timestamp cannot be NaN",
        ));
    }
    if !(-EPOCH_SECONDS_MAX..=EPOCH_SECONDS_MAX).contains(&seconds) {
        return Err(CirroError::new(
            SqlState::DATETIME_FIELD_OVERFLOW,
            format!("timestamp out of range: \"{seconds:e}\""),
        ));
    }
    Ok((seconds * 1_000_000.0).round() as i64)
}

impl ScalarUDFImpl for ToDateTime {
    fn name(&self) -> &str {
        if self.timestamp {
            "to_timestamp"
        } else {
            "to_date"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        match args {
            [t] if self.timestamp && (t.is_numeric() || t == &DataType::Null) => {
                Ok(vec![DataType::Float64])
            }
            [a, b]
                if (is_text(a) || a == &DataType::Null) && (is_text(b) || b == &DataType::Null) =>
            {
                Ok(vec![DataType::Utf8, DataType::Utf8])
            }
            _ => Err(CirroError::new(
                SqlState::UNDEFINED_FUNCTION,
                format!(
                    "function {}({}) does not exist",
                    self.name(),
                    args.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .into_datafusion()),
        }
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(if self.timestamp {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        } else {
            DataType::Date32
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let timestamp = self.timestamp;
        rowwise(&args.args, |arrays| {
            if arrays.len() == 1 {
                let seconds = arrow::compute::cast(&arrays[0], &DataType::Float64)?;
                let seconds = seconds.as_primitive::<arrow::datatypes::Float64Type>();
                let micros = seconds
                    .iter()
                    .map(|s| s.map(seconds_to_micros).transpose())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(to_datafusion)?;
                return Ok(Arc::new(
                    TimestampMicrosecondArray::from(micros).with_timezone("UTC"),
                ));
            }
            let values = texts(&arrays[0])?;
            let templates = texts(&arrays[1])?;
            let (values, templates) = (values.as_string::<i32>(), templates.as_string::<i32>());
            let mut cached: Option<(String, Vec<Field>)> = None;
            let mut parsed = Vec::with_capacity(values.len());
            for i in 0..values.len() {
                if values.is_null(i) || templates.is_null(i) {
                    parsed.push(None);
                    continue;
                }
                let template = templates.value(i);
                if cached.as_ref().is_none_or(|(t, _)| t != template) {
                    cached = Some((template.to_string(), parse_template(template)));
                }
                let fields = cached.as_ref().map(|(_, f)| f.as_slice()).unwrap_or(&[]);
                parsed.push(Some(
                    parse_datetime(values.value(i), fields).map_err(to_datafusion)?,
                ));
            }
            Ok(if timestamp {
                Arc::new(
                    TimestampMicrosecondArray::from(
                        parsed
                            .iter()
                            .map(|p| p.map(|p| p.and_utc().timestamp_micros()))
                            .collect::<Vec<_>>(),
                    )
                    .with_timezone("UTC"),
                ) as ArrayRef
            } else {
                Arc::new(Date32Array::from(
                    parsed
                        .iter()
                        .map(|p| {
                            p.map(|p| {
                                (p.date() - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default())
                                    .num_days() as i32
                            })
                        })
                        .collect::<Vec<_>>(),
                ))
            })
        })
    }
}

/// PostgreSQL's `to_char(date|timestamp, template)`.
pub fn to_char_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ToChar {
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

/// PostgreSQL's `to_date(text, template)`.
pub fn to_date_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ToDateTime {
        signature: Signature::user_defined(Volatility::Immutable),
        timestamp: false,
    })
}

/// PostgreSQL's `to_timestamp(text, template)` and `to_timestamp(seconds)`.
pub fn to_timestamp_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ToDateTime {
        signature: Signature::user_defined(Volatility::Immutable),
        timestamp: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").expect("datetime")
    }

    #[test]
    fn formats_as_postgresql() {
        let t = at("2024-05-17 13:04:05.123456");
        let f = |template: &str| format_datetime(&t, &parse_template(template));
        assert_eq!(f("YYYY-MM-DD"), "2024-05-17");
        assert_eq!(
            f("FMDay, DD Mon YYYY HH12:MI:SS AM"),
            "Friday, 17 May 2024 01:04:05 PM"
        );
        assert_eq!(f("Day"), "Friday   ");
        assert_eq!(f("MONTH|month|Mon"), "MAY      |may      |May");
        assert_eq!(f("HH24:MI:SS.US MS"), "13:04:05.123456 123");
        assert_eq!(f("DDD D Q IW"), "138 6 2 20");
        assert_eq!(f("DDth FMDDTH"), "17th 17TH");
        assert_eq!(f("\"Year\" YYYY"), "Year 2024");
        assert_eq!(f("a.m. p.m."), "p.m. p.m.");
    }

    #[test]
    fn parses_as_postgresql() {
        let p = |text: &str, template: &str| parse_datetime(text, &parse_template(template));
        assert_eq!(
            p("17/05/2024", "DD/MM/YYYY").ok(),
            Some(at("2024-05-17 00:00:00"))
        );
        assert_eq!(
            p("2024-05-17 13:04", "YYYY-MM-DD HH24:MI").ok(),
            Some(at("2024-05-17 13:04:00"))
        );
        assert_eq!(
            p("17 May 2024 01:04 PM", "DD Mon YYYY HH12:MI AM").ok(),
            Some(at("2024-05-17 13:04:00"))
        );
        assert_eq!(
            p("2024-02-30", "YYYY-MM-DD").map_err(|e| e.code()),
            Err("22008")
        );
        assert_eq!(
            p("xx-05-17", "YYYY-MM-DD").map_err(|e| e.code()),
            Err("22007")
        );
    }

    #[test]
    fn epoch_seconds_have_a_range() {
        assert_eq!(seconds_to_micros(1.5).ok(), Some(1_500_000));
        assert_eq!(seconds_to_micros(1e20).map_err(|e| e.code()), Err("22008"));
        assert_eq!(
            seconds_to_micros(f64::NAN).map_err(|e| e.code()),
            Err("22008")
        );
    }
}
