//! Intervals for the bench's ratios: the median of paired per-round ratios with a
//! percentile bootstrap 95% interval, from a seeded generator so the same samples
//! always give the same interval (a report that changes when re-rendered could not
//! be checked), and how many rounds an interval of a given width would take.

use super::stats::percentile_sorted;

/// Resamples per interval: enough that the 2.5th and 97.5th percentiles of the
/// resampled medians move by well under a percent between seeds.
pub const RESAMPLES: usize = 4_000;

/// The generator's seed: fixed, so an interval is a function of its samples.
pub const SEED: u64 = 0x6861_6972_7069_6e21; // "hairpin!"

/// The half-width, relative to the median, the bench aims its intervals at (±3%).
pub const TARGET_HALF_WIDTH: f64 = 0.03;

/// SplitMix64 (Steele, Lea and Flood 2014): a small, well-mixed 64-bit generator,
/// enough for resampling indices and for shuffling the order of a round's targets.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (`n` > 0), by Lemire's multiply-shift: the bias
    /// for the bench's few hundred samples is below 2^-50.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Shuffles `v` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// A median with its bootstrap 95% interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// The samples' median.
    pub median: f64,
    /// The 2.5th percentile of the resampled medians.
    pub lo: f64,
    /// The 97.5th percentile of the resampled medians.
    pub hi: f64,
    /// Samples (rounds) it stands on.
    pub n: usize,
}

impl Interval {
    /// The interval's half-width relative to its median (the larger side): 0.03 is
    /// ±3%.
    pub fn rel_half_width(&self) -> f64 {
        if self.median == 0.0 {
            return f64::INFINITY;
        }
        ((self.hi - self.median).max(self.median - self.lo) / self.median).abs()
    }

    /// Whether the whole interval lies within `[lo, hi]`.
    pub fn within(&self, lo: f64, hi: f64) -> bool {
        self.lo >= lo && self.hi <= hi
    }

    /// Rounds an interval of `target` relative half-width would take, from this
    /// one's: the width of a median's interval shrinks as 1/√n, so
    /// n × (width / target)², and never under 3 (a bootstrap of fewer says nothing).
    pub fn rounds_for(&self, target: f64) -> usize {
        let w = self.rel_half_width();
        if !w.is_finite() {
            return usize::MAX;
        }
        ((self.n as f64 * (w / target).powi(2)).ceil() as usize).max(3)
    }

    /// `0.88× [0.85–0.91]`: a ratio with its interval.
    pub fn show_ratio(&self) -> String {
        if self.n < 2 {
            return format!("{:.2}×", self.median);
        }
        format!("{:.2}× [{:.2}–{:.2}]", self.median, self.lo, self.hi)
    }
}

/// The median of `samples` (non-finite ones left out) with a percentile bootstrap
/// 95% interval of it: `RESAMPLES` resamples with replacement from a generator
/// seeded with `seed`. `None` without samples; one sample gives a zero-width
/// interval that says n = 1.
pub fn bootstrap_median(samples: &[f64], seed: u64) -> Option<Interval> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let median = percentile_sorted(&v, 50.0);
    let mut rng = SplitMix64::new(seed);
    let mut medians = Vec::with_capacity(RESAMPLES);
    let mut draw = vec![0.0; v.len()];
    for _ in 0..RESAMPLES {
        for d in draw.iter_mut() {
            *d = v[rng.below(v.len())];
        }
        draw.sort_by(f64::total_cmp);
        medians.push(percentile_sorted(&draw, 50.0));
    }
    medians.sort_by(f64::total_cmp);
    Some(Interval {
        median,
        lo: percentile_sorted(&medians, 2.5),
        hi: percentile_sorted(&medians, 97.5),
        n: v.len(),
    })
}

/// The ratios of `x` to `y` round by round (round i of both ran in the same round,
/// in random order), with the bootstrap interval of their median. `None` unless the
/// two have the same number of rounds.
pub fn paired_ratio(x: &[f64], y: &[f64]) -> Option<Interval> {
    if x.is_empty() || x.len() != y.len() {
        return None;
    }
    let q: Vec<f64> = x.iter().zip(y).map(|(a, b)| a / b).collect();
    bootstrap_median(&q, SEED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_splitmix64() {
        // The reference outputs of SplitMix64 seeded with 1234567 (the C reference
        // implementation by Vigna, also in Java's SplittableRandom).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn shuffles_are_permutations_and_every_order_turns_up() {
        let mut r = SplitMix64::new(SEED);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..600 {
            let mut v = [0, 1, 2];
            r.shuffle(&mut v);
            let mut s = v;
            s.sort_unstable();
            assert_eq!(s, [0, 1, 2]);
            seen.insert(v);
        }
        assert_eq!(seen.len(), 6, "all 3! orders: {seen:?}");
    }

    #[test]
    fn bootstrap_of_three_samples_matches_the_exact_distribution() {
        // Resampling {1, 2, 3} three times, the median is 1 when at least two draws
        // are 1: 3·(1/3)²·(2/3) + (1/3)³ = 7/27; 3 likewise; 2 otherwise, 13/27.
        // So the 2.5th percentile is 1 and the 97.5th is 3.
        let i = bootstrap_median(&[3.0, 1.0, 2.0], SEED).unwrap();
        assert_eq!((i.median, i.lo, i.hi, i.n), (2.0, 1.0, 3.0, 3));
        // And the frequency of each median is the exact one within sampling error
        // (4000 draws: the standard error of 13/27 is 0.008).
        let mut rng = SplitMix64::new(SEED);
        let mut twos = 0;
        for _ in 0..RESAMPLES {
            let mut d = [0.0; 3].map(|_| [1.0, 2.0, 3.0][rng.below(3)]);
            d.sort_by(f64::total_cmp);
            twos += usize::from(d[1] == 2.0);
        }
        let share = twos as f64 / RESAMPLES as f64;
        assert!((share - 13.0 / 27.0).abs() < 0.03, "{share}");
    }

    #[test]
    fn bootstrap_is_deterministic_and_narrows_as_one_over_root_n() {
        // Deterministic "noise": ratios 1 ± 5% spread evenly, 16 and 64 rounds.
        let spread = |n: usize| -> Vec<f64> {
            let mut r = SplitMix64::new(7);
            (0..n)
                .map(|_| 0.95 + 0.1 * (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
                .collect()
        };
        let (a, b) = (spread(16), spread(64));
        let ia = bootstrap_median(&a, SEED).unwrap();
        assert_eq!(ia, bootstrap_median(&a, SEED).unwrap());
        let ib = bootstrap_median(&b, SEED).unwrap();
        assert!(ia.lo <= ia.median && ia.median <= ia.hi);
        assert!(ia.lo > 0.95 && ia.hi < 1.05, "{ia:?}");
        // Four times the rounds: about half the width.
        let shrink = ib.rel_half_width() / ia.rel_half_width();
        assert!((0.3..0.8).contains(&shrink), "{shrink} {ia:?} {ib:?}");
        // And what 16 rounds say 3% needs is near what 64 give.
        let need = ia.rounds_for(ib.rel_half_width());
        assert!((25..=160).contains(&need), "{need}");
    }

    #[test]
    fn one_sample_and_no_samples() {
        let i = bootstrap_median(&[1.5], SEED).unwrap();
        assert_eq!((i.lo, i.hi, i.n), (1.5, 1.5, 1));
        assert_eq!(i.show_ratio(), "1.50×");
        assert_eq!(bootstrap_median(&[f64::NAN], SEED), None);
        assert_eq!(paired_ratio(&[1.0], &[1.0, 2.0]), None);
        let q = paired_ratio(&[2.0, 4.0, 6.0], &[2.0, 4.0, 6.0]).unwrap();
        assert_eq!((q.median, q.lo, q.hi), (1.0, 1.0, 1.0));
        assert!(q.within(0.97, 1.03));
        assert_eq!(q.show_ratio(), "1.00× [1.00–1.00]");
        assert_eq!(q.rounds_for(0.03), 3);
    }
}
