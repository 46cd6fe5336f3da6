//! Per-item log lines with a budget: the first [`PER_PASS`] items of one pass (a
//! reconcile, an adoption) each get their line at the level asked; the rest are
//! counted and told in one line at the end. A restart with 100,000 frontends then
//! writes a few dozen lines, not 100,000, and each item is still at debug level.

/// Items told one by one per pass; the rest in one summary line.
pub(crate) const PER_PASS: usize = 64;

/// Counts the items of one pass and says whether each still gets its own line.
#[derive(Debug, Default)]
pub(crate) struct LogBudget {
    seen: usize,
}

impl LogBudget {
    /// Counts one item: whether it still gets its line at the level asked (else at
    /// debug level). Used through [`item!`](crate::item).
    pub(crate) fn own_line(&mut self) -> bool {
        self.seen += 1;
        self.seen <= PER_PASS
    }

    /// Calls `say` with how many items got no line of their own, if any.
    pub(crate) fn more(&self, say: impl FnOnce(usize)) {
        if self.seen > PER_PASS {
            say(self.seen - PER_PASS);
        }
    }
}

/// One item's line under a [`LogBudget`]: `item!(budget, info, field = %v, "message")`
/// logs at `info` while the budget lasts, at debug level after.
#[macro_export]
macro_rules! item {
    ($budget:expr, $level:ident, $($rest:tt)+) => {
        if $budget.own_line() {
            tracing::$level!($($rest)+)
        } else {
            tracing::debug!($($rest)+)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_items_get_a_line_and_the_rest_one_summary() {
        let mut b = LogBudget::default();
        let lines = (0..PER_PASS + 10).filter(|_| b.own_line()).count();
        assert_eq!(lines, PER_PASS);
        let mut more = None;
        b.more(|n| more = Some(n));
        assert_eq!(more, Some(10));

        let mut few = LogBudget::default();
        assert!(few.own_line());
        let mut said = false;
        few.more(|_| said = true);
        assert!(!said, "no summary when every item had its line");
    }
}
