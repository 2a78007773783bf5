//! The writers' rate limit for denial records (`syscall_denied`, `fs_denied`, `net`): a
//! token bucket that lets a burst through, then a steady rate, and counts what it leaves
//! out so the next record that passes can report it (`suppressed`).

use std::time::Instant;

/// Records allowed in a burst.
pub const BURST: f64 = 50.0;
/// Records allowed per second after the burst.
pub const PER_SECOND: f64 = 10.0;

/// A token bucket: at most [`BURST`] records at once, [`PER_SECOND`] after.
#[derive(Debug)]
pub struct RateLimit {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimit {
    /// A full bucket.
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A full bucket whose clock starts at `at`.
    pub fn starting_at(at: Instant) -> Self {
        Self {
            tokens: BURST,
            at,
            suppressed: 0,
        }
    }

    /// Whether a record may be written at `now`; a refusal is counted.
    pub fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * PER_SECOND;
        self.tokens = (self.tokens + refill).min(BURST);
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            false
        }
    }

    /// Counts `count` records left out by someone else (e.g. the kernel's audit queue), to
    /// be reported with the next record.
    pub fn add_suppressed(&mut self, count: u64) {
        self.suppressed = self.suppressed.saturating_add(count);
    }

    /// The records left out since the last call, for the record being written now.
    pub fn take_suppressed(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }

    /// The records left out since the last [`RateLimit::take_suppressed`].
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bucket_allows_a_burst_then_counts_what_it_drops() {
        let t = Instant::now();
        let mut b = RateLimit::starting_at(t);
        let taken = (0..200).filter(|_| b.take(t)).count();
        assert_eq!(taken, 50);
        assert_eq!(b.suppressed(), 150);
        assert!(b.take(t + Duration::from_millis(150)));
        assert_eq!(b.take_suppressed(), 150);
        assert_eq!(b.suppressed(), 0);
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let t = Instant::now() + Duration::from_secs(10);
        let mut b = RateLimit::starting_at(t);
        for _ in 0..50 {
            assert!(b.take(t));
        }
        assert!(!b.take(t - Duration::from_secs(5)));
        assert!(!b.take(t));
    }
}
