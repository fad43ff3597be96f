//! Backoff between attempts: exponential with full jitter, overridden by `Retry-After`.

use std::time::{Duration, SystemTime};

/// How many times and how patiently to retry a failed model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt. Default: 3.
    pub max_retries: u32,
    /// Backoff of the first retry, doubled each time. Default: 250 ms.
    pub base_delay: Duration,
    /// Largest backoff, and the cap on an honoured `Retry-After`. Default: 20 s.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_retries: 3, base_delay: Duration::from_millis(250), max_delay: Duration::from_secs(20) }
    }
}

impl RetryPolicy {
    /// Delay before retry number `retry` (1-based): the server's `Retry-After` if it sent
    /// one (capped), else a random delay in `[0, min(max, base·2^(retry-1))]`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(d) = retry_after {
            return d.min(self.max_delay);
        }
        let exp = self.base_delay.saturating_mul(1u32 << (retry.saturating_sub(1)).min(16));
        let cap = exp.min(self.max_delay);
        cap.mul_f64(rand::random::<f64>())
    }
}

/// Parses a `Retry-After` value: delta seconds or an HTTP date.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let p =
            RetryPolicy { max_retries: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(1) };
        for _ in 0..50 {
            assert!(p.delay(1, None) <= Duration::from_millis(100));
            assert!(p.delay(3, None) <= Duration::from_millis(400));
            assert!(p.delay(10, None) <= Duration::from_secs(1));
        }
        assert_eq!(p.delay(1, Some(Duration::from_millis(700))), Duration::from_millis(700));
        assert_eq!(p.delay(1, Some(Duration::from_secs(60))), Duration::from_secs(1));
    }
}
