//! Small statistics over repeated runs: every figure the bench reports carries its
//! spread, so one lucky or unlucky run cannot pass for the result.

/// min / median / max of a set of samples, and how many there were.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// Smallest sample.
    pub min: f64,
    /// Median (mean of the two middle samples for an even count).
    pub median: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub n: usize,
}

impl Spread {
    /// The spread of `samples`; `None` when there are none (a case that did not run).
    pub fn of(samples: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Spread {
            min: v[0],
            median: percentile_sorted(&v, 50.0),
            max: v[v.len() - 1],
            n: v.len(),
        })
    }

    /// `median (min–max)` with `digits` decimals, the form every table cell uses.
    pub fn show(&self, digits: usize) -> String {
        if self.n == 1 {
            return format!("{:.digits$}", self.median);
        }
        format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            self.median, self.min, self.max
        )
    }
}

/// The `p`th percentile (0–100) of already sorted samples, interpolating linearly
/// between neighbours as numpy's default does.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (p / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let frac = rank - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

/// The `p`th percentile of unsorted samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, p)
}

/// `a / b` of two medians, `None` when either is missing or `b` is zero.
pub fn ratio(a: Option<Spread>, b: Option<Spread>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b.median != 0.0 => Some(a.median / b.median),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_odd_and_even_counts() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.n), (1.0, 2.0, 3.0, 3));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[f64::NAN]), None);
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert!((percentile(&v, 99.0) - 99.01).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 50.0), 7.0);
    }

    #[test]
    fn show_and_ratio() {
        let s = Spread::of(&[1.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.show(1), "2.0 (1.0–4.0)");
        assert_eq!(Spread::of(&[5.0]).unwrap().show(0), "5");
        assert_eq!(ratio(Some(s), Spread::of(&[4.0])), Some(0.5));
        assert_eq!(ratio(Some(s), None), None);
    }
}
