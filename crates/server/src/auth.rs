//! Request authentication: `none` (an internal service behind a backend, as seed 002),
//! `api_key` (per-tenant keys, stored as SHA-256 hashes) and `hmac` (the caller signs
//! `timestamp.body` with a shared secret — the scheme of the backend callbacks).
//!
//! Comparisons are constant-time; an HMAC signature is accepted once within its window, so
//! a captured request cannot be replayed. A request without a body (a `GET`) signs its target
//! (path and query) in place of the body, so its signature cannot be moved to another URL.

use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use subtle::ConstantTimeEq;

/// How long a signed request stays valid, either side of now.
pub const HMAC_WINDOW: Duration = Duration::from_secs(300);

/// How requests prove who sent them.
pub enum Auth {
    /// Trust the network (an internal service behind a backend).
    None,
    /// `Authorization: Bearer <key>`; keys by tenant slug, stored as SHA-256 digests.
    ApiKey(ApiKeys),
    /// `X-Timestamp` (Unix seconds) and `X-Signature` (hex HMAC-SHA256 of `timestamp.body`).
    Hmac(HmacVerifier),
}

impl Auth {
    /// `api_key` mode from `[server.api_keys]`: tenant slug → hex SHA-256 of its key.
    ///
    /// # Errors
    /// The slug whose digest is not 64 hex digits.
    pub fn api_keys<'a>(digests: impl IntoIterator<Item = (&'a String, &'a String)>) -> Result<Self, String> {
        let mut keys = HashMap::new();
        for (slug, digest) in digests {
            let bytes: [u8; 32] = hex::decode(digest)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| format!("the key digest of tenant '{slug}' is not a hex SHA-256"))?;
            keys.insert(slug.clone(), bytes);
        }
        Ok(Self::ApiKey(ApiKeys { keys, tenant_ids: HashMap::new() }))
    }

    /// Binds `api_key` slugs to their numeric tenant ids (`[server.api_key_tenants]`): a
    /// request whose body, query or path names another `tenantId` than its key's gets 403.
    /// Without a binding, a key vouches for its slug only, and the ids are the client's word.
    ///
    /// # Errors
    /// A slug without a key, or this is not `api_key` mode.
    pub fn bind_tenant_ids<'a>(mut self, ids: impl IntoIterator<Item = (&'a String, &'a i64)>) -> Result<Self, String> {
        let Self::ApiKey(keys) = &mut self else {
            return Err("tenant ids bind API keys, and auth is not api_key".into());
        };
        for (slug, id) in ids {
            if !keys.keys.contains_key(slug) {
                return Err(format!("tenant '{slug}' has an id but no API key"));
            }
            keys.tenant_ids.insert(slug.clone(), *id);
        }
        Ok(self)
    }

    /// The `api_key` slugs without a bound tenant id (for a start-up warning).
    pub fn unbound_slugs(&self) -> Vec<&str> {
        match self {
            Self::ApiKey(k) => {
                let mut v: Vec<&str> =
                    k.keys.keys().filter(|s| !k.tenant_ids.contains_key(*s)).map(String::as_str).collect();
                v.sort_unstable();
                v
            }
            _ => Vec::new(),
        }
    }

    /// Checks a request: its headers, its target (path and query) and its body.
    pub fn check(&self, headers: &HeaderMap, target: &str, body: &[u8]) -> Result<(), ApiError> {
        match self {
            Self::None => Ok(()),
            Self::ApiKey(keys) => {
                let denied = || ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong API key");
                let slug = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok()).ok_or_else(denied)?;
                let key = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .ok_or_else(denied)?;
                let expected = keys.keys.get(slug).ok_or_else(denied)?;
                let got: [u8; 32] = Sha256::digest(key.as_bytes()).into();
                if !bool::from(got.ct_eq(expected)) {
                    return Err(denied());
                }
                match keys.tenant_ids.get(slug) {
                    Some(&own) if claimed_tenant_ids(target, body).any(|id| id != own) => Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        format!("the API key of tenant '{slug}' opens tenant id {own} only"),
                    )),
                    _ => Ok(()),
                }
            }
            Self::Hmac(v) => v.verify_request(headers, target, body, now_secs()).map_err(bad_signature),
        }
    }
}

/// `api_key` mode's keys: tenant slug → SHA-256 of the key, and the tenant ids bound to slugs.
pub struct ApiKeys {
    keys: HashMap<String, [u8; 32]>,
    tenant_ids: HashMap<String, i64>,
}

/// Every tenant id a request names: a JSON body's `tenantId`, a `tenantId` query parameter, and
/// the id of a `/tenants/{id}` path. One that is not a number counts as 0, which no bound
/// tenant has (bound ids are positive).
fn claimed_tenant_ids<'a>(target: &'a str, body: &'a [u8]) -> impl Iterator<Item = i64> + 'a {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    // Decoded as the Query extractor decodes it, so `tenant%49d=8` is seen too.
    let from_query = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(name, _)| name == "tenantId")
        .map(|(_, value)| parse_id(&value));
    let from_path = path.split_once("/tenants/").map(|(_, rest)| parse_id(rest.split('/').next().unwrap_or("")));
    let from_body = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("tenantId").cloned())
        .map(|v| v.as_i64().unwrap_or(0));
    from_query.chain(from_path).chain(from_body)
}

fn parse_id(text: &str) -> i64 {
    text.parse().unwrap_or(0)
}

/// The 401 answer to a request whose signature failed for `reason`.
pub(crate) fn bad_signature(reason: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, format!("bad signature: {reason}"))
}

/// Reads the body of `req` (at most `max` bytes, else 413), has `check` judge the headers,
/// the target (path and query) and the body, and gives the request back whole. Signatures
/// cover the body, so a checking middleware must read it before the handler does.
pub(crate) async fn check_whole_request(
    req: axum::extract::Request,
    max: usize,
    check: impl FnOnce(&HeaderMap, &str, &[u8]) -> Result<(), ApiError>,
) -> Result<axum::extract::Request, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, max)
        .await
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than {max} bytes")))?;
    let target = parts.uri.path_and_query().map_or(parts.uri.path(), |pq| pq.as_str());
    check(&parts.headers, target, &bytes)?;
    Ok(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes)))
}

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

/// The SHA-256 digest of an API key, as `[server.api_keys]` stores it (hex).
pub fn hash_api_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Signs `body` at `timestamp` with `secret`: hex HMAC-SHA256 of `"{timestamp}.{body}"`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC accepts keys of any length"); // invariant
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Verifies signed requests: the library function a receiving side (the backend's
/// `/internal/chatbot/**`, or this service) uses.
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
        let header = |name| headers.get(name).and_then(|v: &axum::http::HeaderValue| v.to_str().ok());
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

    #[test]
    fn a_bound_key_opens_its_own_tenant_id_only() {
        let auth = Auth::api_keys([(&"demo".to_string(), &hash_api_key("k-1"))])
            .unwrap()
            .bind_tenant_ids([(&"demo".to_string(), &7)])
            .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant-slug", "demo".parse().unwrap());
        headers.insert("authorization", "Bearer k-1".parse().unwrap());
        let status = |target: &str, body: &str| auth.check(&headers, target, body.as_bytes()).err().map(|e| e.status);
        assert_eq!(status("/api/chatbot/stream", r#"{"tenantId":7,"userId":1}"#), None);
        assert_eq!(status("/api/chatbot/stream", r#"{"tenantId":8,"userId":1}"#), Some(StatusCode::FORBIDDEN));
        assert_eq!(status("/api/chatbot/stream", r#"{"tenantId":"7"}"#), Some(StatusCode::FORBIDDEN));
        assert_eq!(status("/api/chatbot/runs/r/events?tenantId=7&userId=1", ""), None);
        assert_eq!(status("/api/chatbot/runs/r/events?userId=1&tenantId=9", ""), Some(StatusCode::FORBIDDEN));
        assert_eq!(status("/api/chatbot/runs/r/events?tenant%49d=9", ""), Some(StatusCode::FORBIDDEN), "encoded");
        assert_eq!(status("/api/chatbot/runs/r/events?tenantId=%39", ""), Some(StatusCode::FORBIDDEN), "encoded");
        assert_eq!(status("/api/chatbot/tenants/7", ""), None);
        assert_eq!(status("/api/chatbot/tenants/8", ""), Some(StatusCode::FORBIDDEN));
        assert!(auth.unbound_slugs().is_empty());
        let unbound = Auth::api_keys([(&"demo".to_string(), &hash_api_key("k-1"))]).unwrap();
        assert_eq!(unbound.unbound_slugs(), ["demo"]);
        assert!(unbound.bind_tenant_ids([(&"acme".to_string(), &3)]).is_err(), "a slug without a key");
    }

    #[test]
    fn api_keys_are_checked_against_their_hash() {
        let auth = Auth::api_keys([(&"demo".to_string(), &hash_api_key("k-123"))]).unwrap();
        assert!(Auth::api_keys([(&"x".to_string(), &"not hex".to_string())]).err().is_some_and(|e| e.contains("'x'")));
        let mut h = HeaderMap::new();
        h.insert("x-tenant-slug", "demo".parse().unwrap());
        assert!(auth.check(&h, "/api/chatbot/stream", b"").is_err());
        h.insert("authorization", "Bearer k-124".parse().unwrap());
        assert_eq!(auth.check(&h, "/api/chatbot/stream", b"").unwrap_err().status, StatusCode::UNAUTHORIZED);
        h.insert("authorization", "Bearer k-123".parse().unwrap());
        assert!(auth.check(&h, "/api/chatbot/stream", b"").is_ok());
        h.insert("x-tenant-slug", "other".parse().unwrap());
        assert!(auth.check(&h, "/api/chatbot/stream", b"").is_err(), "a key opens its own tenant only");
    }
}
