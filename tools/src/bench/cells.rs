//! How a figure reads in a table cell: a spread with its digits, a ratio, µs as ms.
//! Shared by the report and the baseline comparison.

use super::stats::Spread;

/// A spread's cell with `digits` decimals, or a dash when not measured.
pub(super) fn cell(s: Option<Spread>, digits: usize) -> String {
    s.map_or("—".into(), |s| s.show(digits))
}

/// A ratio's cell (`0.87×`), or a dash.
pub(super) fn q_cell(q: Option<f64>) -> String {
    q.map_or("—".into(), |q| format!("{q:.2}×"))
}

/// A spread of µs as ms.
pub(super) fn ms(s: Option<Spread>) -> Option<Spread> {
    s.map(|s| Spread {
        min: s.min / 1e3,
        median: s.median / 1e3,
        max: s.max / 1e3,
        n: s.n,
    })
}
