//! The HMAC scheme of the backend calls, both ways: the caller signs `timestamp.body` with the
//! shared secret (`X-Timestamp`, `X-Signature`); the receiver checks the signature, the window
//! and that it has not seen the signature before. The chat service's own `hmac` auth mode uses
//! the same scheme, so one implementation serves both.
//!
//! Comparisons are constant-time; an accepted signature is remembered for its window, so a
//! captured request cannot be replayed. A request without a body (a `GET`) signs its target
//! (path and query) in place of the body, so its signature cannot be moved to another URL.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a signed request stays valid, either side of now.
pub const HMAC_WINDOW: Duration = Duration::from_secs(300);

/// The bytes a request's signature covers: its body, or its target (path and query) when
/// the body is empty.
pub fn signed_bytes<'a>(target: &'a str, body: &'a [u8]) -> &'a [u8] {
    if body.is_empty() { target.as_bytes() } else { body }
}

/// The signature headers of a request to `target` with `body`, signed now: `X-Timestamp` and
/// `X-Signature`, as [`HmacVerifier::verify_request`] checks them.
pub fn signature_headers(secret: &[u8], target: &str, body: &[u8]) -> [(&'static str, String); 2] {
    let ts = now_secs();
    [("x-timestamp", ts.to_string()), ("x-signature", sign(secret, ts, signed_bytes(target, body)))]
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Signs `body` at `timestamp` with `secret`: hex HMAC-SHA256 of `"{timestamp}.{body}"`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC accepts keys of any length"); // invariant
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Verifies signed requests: what a receiving side (a backend's `/internal/chatbot/**`, or the
/// chat service in `hmac` mode) checks.
pub struct HmacVerifier {
    secret: Vec<u8>,
    /// Signatures already accepted, with their timestamps, oldest first.
    seen: Mutex<VecDeque<(i64, String)>>,
}

/// Most remembered signatures; older ones fall out of the window anyway.
const SEEN_CAP: usize = 100_000;

impl HmacVerifier {
    /// A verifier for `secret`.
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Self { secret: secret.into(), seen: Mutex::new(VecDeque::new()) }
    }

    /// Accepts a request signed within [`HMAC_WINDOW`] of `now`, with a correct signature,
    /// seen for the first time. The error names the reason.
    ///
    /// # Errors
    /// `"stale"`, `"malformed"`, `"mismatch"` or `"replayed"`.
    pub fn verify(&self, timestamp: &str, signature: &str, body: &[u8], now: i64) -> Result<(), &'static str> {
        let ts: i64 = timestamp.trim().parse().map_err(|_| "malformed")?;
        if (now - ts).unsigned_abs() > HMAC_WINDOW.as_secs() {
            return Err("stale");
        }
        let given = hex::decode(signature.trim()).map_err(|_| "malformed")?;
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).map_err(|_| "malformed")?;
        mac.update(ts.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        // `verify_slice` compares in constant time.
        mac.verify_slice(&given).map_err(|_| "mismatch")?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        while seen.front().is_some_and(|(t, _)| (now - *t).unsigned_abs() > HMAC_WINDOW.as_secs())
            || seen.len() > SEEN_CAP
        {
            seen.pop_front();
        }
        let sig = signature.trim().to_ascii_lowercase();
        if seen.iter().any(|(_, s)| *s == sig) {
            return Err("replayed");
        }
        seen.push_back((ts, sig));
        Ok(())
    }

    /// [`verify`](Self::verify) for a whole request: `X-Timestamp` and `X-Signature` from
    /// `headers`, over the body, or over `target` (path and query) when the body is empty.
    ///
    /// # Errors
    /// As [`verify`](Self::verify); `"unsigned"` when a header is missing.
    pub fn verify_request(&self, headers: &HeaderMap, target: &str, body: &[u8], now: i64) -> Result<(), &'static str> {
        let header = |name| headers.get(name).and_then(|v: &http::HeaderValue| v.to_str().ok());
        let (Some(ts), Some(sig)) = (header("x-timestamp"), header("x-signature")) else {
            return Err("unsigned");
        };
        self.verify(ts, sig, signed_bytes(target, body), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_rejects_stale_tampered_replayed_and_malformed_requests() {
        let v = HmacVerifier::new(b"shared-secret".to_vec());
        let now = 1_800_000_000;
        let body = br#"{"tenantSlug":"demo"}"#;
        let sig = sign(b"shared-secret", now, body);
        assert_eq!(v.verify(&now.to_string(), &sig, body, now), Ok(()));
        assert_eq!(v.verify(&now.to_string(), &sig, body, now + 1), Err("replayed"));
        let old = now - 301;
        assert_eq!(v.verify(&old.to_string(), &sign(b"shared-secret", old, body), body, now), Err("stale"));
        let sig2 = sign(b"shared-secret", now + 5, body);
        assert_eq!(v.verify(&(now + 5).to_string(), &sig2, br#"{"tenantSlug":"evil"}"#, now), Err("mismatch"));
        assert_eq!(v.verify(&(now + 5).to_string(), &sign(b"other", now + 5, body), body, now), Err("mismatch"));
        assert_eq!(v.verify("yesterday", &sig2, body, now), Err("malformed"));
        assert_eq!(v.verify(&(now + 5).to_string(), "zz", body, now), Err("malformed"));
    }

    #[test]
    fn a_request_without_a_body_signs_its_target() {
        let v = HmacVerifier::new(b"k".to_vec());
        let now = now_secs();
        let mut h = HeaderMap::new();
        assert_eq!(v.verify_request(&h, "/internal/chatbot/history?conversationId=1", b"", now), Err("unsigned"));
        for (name, value) in signature_headers(b"k", "/internal/chatbot/history?conversationId=1", b"") {
            h.insert(name, value.parse().unwrap());
        }
        // The same headers on another URL do not verify.
        assert_eq!(v.verify_request(&h, "/internal/chatbot/history?conversationId=2", b"", now), Err("mismatch"));
        assert_eq!(v.verify_request(&h, "/internal/chatbot/history?conversationId=1", b"", now), Ok(()));
        assert_eq!(v.verify_request(&h, "/internal/chatbot/history?conversationId=1", b"", now), Err("replayed"));
        // With a body, the body is what is signed: the target may be anything.
        let mut h = HeaderMap::new();
        for (name, value) in signature_headers(b"k", "/a", b"{}") {
            h.insert(name, value.parse().unwrap());
        }
        assert_eq!(v.verify_request(&h, "/b", b"{}", now), Ok(()));
    }
}
