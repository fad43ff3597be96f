//! [`LlmError`]: every way a model call can fail, naming the endpoint involved.

use std::time::Duration;

/// A failed model call. Messages name the endpoint and, for HTTP errors, the status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The connection could not be made (refused, DNS, TLS, connect timeout).
    #[error("cannot connect to model endpoint {endpoint}: {reason}")]
    Connect {
        /// The URL called.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// The endpoint answered with a non-success status.
    #[error("model endpoint {endpoint} answered HTTP {status}: {body}")]
    Status {
        /// The URL called.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body (the provider's explanation).
        body: String,
        /// The `Retry-After` the endpoint asked for, if any.
        retry_after: Option<Duration>,
    },
    /// No response (headers or first chunk) within the first-byte timeout.
    #[error("model endpoint {endpoint} sent nothing within {after:?}")]
    FirstByteTimeout {
        /// The URL called.
        endpoint: String,
        /// The limit.
        after: Duration,
    },
    /// The stream went silent between chunks for longer than the idle timeout.
    #[error("model endpoint {endpoint} went silent for {after:?} in the middle of a reply")]
    IdleTimeout {
        /// The URL called.
        endpoint: String,
        /// The limit.
        after: Duration,
    },
    /// A chunk or body that is not the OpenAI chat-completions format.
    #[error("model endpoint {endpoint} sent a malformed chunk: {detail}")]
    Malformed {
        /// The URL called.
        endpoint: String,
        /// What was wrong, with the start of the offending data.
        detail: String,
    },
    /// The connection broke while reading the reply.
    #[error("model endpoint {endpoint}: the reply broke off: {reason}")]
    Transport {
        /// The URL called.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// The provider reported an error inside a successful response.
    #[error("model endpoint {endpoint} reported an error: {message}")]
    Provider {
        /// The URL called.
        endpoint: String,
        /// The provider's message.
        message: String,
    },
    /// Every allowed attempt failed; `last` is the final failure.
    #[error("{last} (gave up after {attempts} attempts)")]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: Box<LlmError>,
    },
    /// A stream ended without saying it finished.
    #[error("the model's reply ended before it finished")]
    Incomplete,
    /// The request or configuration cannot be sent.
    #[error("invalid model request: {0}")]
    InvalidRequest(String),
}

impl LlmError {
    /// Whether another attempt may succeed (connect failures, timeouts before any reply,
    /// 408/409/429 and 5xx statuses).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::FirstByteTimeout { .. } | Self::Transport { .. } => true,
            Self::Status { status, .. } => matches!(status, 408 | 409 | 429) || *status >= 500,
            _ => false,
        }
    }

    /// The HTTP status involved, if any (looks through retries).
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            Self::RetriesExhausted { last, .. } => last.status(),
            _ => None,
        }
    }
}

/// `e` and every error beneath it, joined with ": " ("error sending request: connection
/// refused"): a transport error's own message rarely says what actually failed.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
