//! What the random-SQL tests (`fuzz.rs`, `differential_queries.rs`) share:
//! the column types they generate and the draws they make.

use rand::Rng;
use rand::rngs::StdRng;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ty {
    Int,
    Num,
    Text,
    Bool,
    Date,
    Ts,
}

pub const TYPES: [Ty; 6] = [Ty::Int, Ty::Num, Ty::Text, Ty::Bool, Ty::Date, Ty::Ts];

/// Draws of a seeded generator.
pub trait Draw {
    /// One of `items`.
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str;
    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u32) -> bool;
    /// One of [`TYPES`].
    fn any_type(&mut self) -> Ty;
}

impl Draw for StdRng {
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.random_range(0..items.len())]
    }

    fn chance(&mut self, percent: u32) -> bool {
        self.random_range(0..100) < percent
    }

    fn any_type(&mut self) -> Ty {
        TYPES[self.random_range(0..TYPES.len())]
    }
}
