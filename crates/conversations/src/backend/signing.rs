//! The HMAC scheme of signed requests, both ways (docs/service.md, "Signed requests"): the
//! service's calls to its backend (`/internal/chatbot/**`, under `server.backend_hmac_secret`)
//! and a backend's requests to the service in `auth = "hmac"` mode (under `server.hmac_secret`).
//! One implementation serves both; each direction is verified with its own secret.
//!
//! Owns: the v2 canonical string ([`SignedRequest::canonical`]), signing ([`sign`],
//! [`signature_headers`]), and the receiving side's check ([`HmacVerifier`]: signature, window,
//! and the nonce claimed once in a [`ReplayStore`]).
//!
//! Scheme v2 signs the request, not only its body:
//!
//! ```text
//! v2\n{METHOD}\n{path}\n{query}\n{tenant slug}\n{timestamp}\n{nonce}\n{hex sha256(body)}
//! ```
//!
//! sent as `X-Signature: v2=<hex HMAC-SHA256 of that string>`, `X-Timestamp` (Unix seconds)
//! and `X-Nonce` (16 to 64 of `A-Z a-z 0-9 - _`, new for every request). Why each part: the
//! method and path, so a `conversations/list` signature is no `delete/user` call, a `send_sms`
//! one no `send_telegram`, a GET no DELETE; the query, so `history?conversationId=1` opens no
//! other conversation; the tenant slug (`X-Tenant-Slug`, empty without one), because a backend
//! acts for the tenant it names; the body's digest, so a body and a bodiless request's target
//! are never the same signed bytes (v1's flaw); the nonce, the replay key, so a request is
//! accepted once in its window across every verifier sharing the store.
//!
//! Path and query are normalised so that what a client's URL library re-encodes still verifies,
//! without two requests that a handler reads differently sharing a string: percent-escapes are
//! decoded and every byte outside `A-Z a-z 0-9 - . _ ~` escaped again as `%XX` (upper case); in
//! the path a literal `/` stays and an escaped one stays escaped (routers tell them apart); the
//! query is decoded as a form (`+` is a space, as axum's `Query` reads it), its `name=value`
//! pairs sorted by name — stably, so repeated names keep their order. Method, slug and nonce are
//! escaped the same way, so no part can hold the separator.
//!
//! v1 (`"{timestamp}.{body}"`, the target for a bodiless request, `X-Signature: <hex>`) is
//! refused unless a verifier is built [`accepting_v1`](HmacVerifier::accepting_v1) for a
//! migration window; its replay key is then the signature itself.

use super::replay::{MemoryReplayStore, ReplayError, ReplayStore};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, percent_encode};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a signed request stays valid, either side of now.
pub const HMAC_WINDOW: Duration = Duration::from_secs(300);

/// The version tag of the scheme: the first line of the canonical string and the prefix of
/// `X-Signature`.
pub const VERSION: &str = "v2";

/// `X-Timestamp`: Unix seconds of the signature.
pub const TIMESTAMP_HEADER: &str = "x-timestamp";
/// `X-Nonce`: the request's unique value, its replay key.
pub const NONCE_HEADER: &str = "x-nonce";
/// `X-Signature`: `v2=<hex>`.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// `X-Tenant-Slug`: the tenant a request acts for, signed with it.
pub const TENANT_HEADER: &str = "x-tenant-slug";

/// Shortest and longest nonce accepted.
const NONCE_LEN: std::ops::RangeInclusive<usize> = 16..=64;

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// `X-Timestamp` or `X-Signature` (or, for v2, `X-Nonce`) is missing.
    #[error("unsigned")]
    Unsigned,
    /// A signature header is not of its form; names the header.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The timestamp is outside [`HMAC_WINDOW`] of now.
    #[error("stale")]
    Stale,
    /// The signature is not the secret's over this request.
    #[error("mismatch")]
    Mismatch,
    /// The nonce (v1: the signature) was accepted before.
    #[error("replayed")]
    Replayed,
    /// A v1 signature, and this verifier accepts v2 only.
    #[error("v1 signatures are not accepted; sign v2 (docs/service.md, \"Signed requests\")")]
    V1Refused,
    /// The replay store could not record the nonce: the request may be good, but cannot be
    /// accepted without knowing it is not a replay.
    #[error("replay store: {0}")]
    ReplayStore(#[from] ReplayError),
}

impl SignatureError {
    /// Whether the verifier could not decide (its replay store is full or unreachable), as
    /// opposed to a request that is refused: 503 for the first, 401 for the rest.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::ReplayStore(_))
    }
}

/// What a v2 signature covers.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    /// The HTTP method, as sent (`GET`, `POST`, …).
    pub method: &'a str,
    /// The path and query, as on the request line (`/internal/chatbot/history?conversationId=1`).
    pub target: &'a str,
    /// `X-Tenant-Slug`, when the request carries one.
    pub tenant_slug: Option<&'a str>,
    /// The body, empty for none.
    pub body: &'a [u8],
}

impl SignedRequest<'_> {
    /// The string a v2 signature is the HMAC of (see the module's documentation).
    pub fn canonical(&self, timestamp: i64, nonce: &str) -> String {
        let (path, query) = self.target.split_once('?').unwrap_or((self.target, ""));
        let mut out = String::with_capacity(self.target.len() + 160);
        out.push_str(VERSION);
        out.push('\n');
        escape_into(&mut out, self.method.as_bytes());
        out.push('\n');
        canonical_path(&mut out, path);
        out.push('\n');
        canonical_query(&mut out, query);
        out.push('\n');
        escape_into(&mut out, self.tenant_slug.unwrap_or_default().as_bytes());
        let _ = write!(out, "\n{timestamp}\n");
        escape_into(&mut out, nonce.as_bytes());
        out.push('\n');
        out.push_str(&hex::encode(Sha256::digest(self.body)));
        out
    }
}

/// Every byte but the unreserved URI characters (RFC 3986: `A-Z a-z 0-9 - . _ ~`), which alone
/// are left unescaped.
const RESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `bytes` with every reserved byte as `%XX` (upper-case hex).
fn escape_into(out: &mut String, bytes: &[u8]) {
    out.extend(percent_encode(bytes, RESERVED));
}

/// The path with escapes decoded and re-escaped, segment by segment: a literal `/` stays the
/// separator it is, an escaped one (`%2F`) is decoded within its segment and so escaped again.
fn canonical_path(out: &mut String, path: &str) {
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        escape_into(out, &percent_decode_str(segment).collect::<Vec<u8>>());
    }
}

/// A query component decoded as a form: `+` is a space, `%XY` its byte.
fn form_decode(part: &str) -> Vec<u8> {
    percent_decode_str(&part.replace('+', " ")).collect()
}

/// The query's pairs decoded, re-escaped and sorted by name (stably), joined by `&`.
fn canonical_query(out: &mut String, query: &str) {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            let (mut n, mut v) = (String::new(), String::new());
            escape_into(&mut n, &form_decode(name));
            escape_into(&mut v, &form_decode(value));
            (n, v)
        })
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(value);
    }
}

fn mac(secret: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC accepts keys of any length") // invariant
}

/// The v2 signature of `request` at `timestamp` with `nonce`: `v2=<hex>`, the value of
/// `X-Signature`.
pub fn sign(secret: &[u8], request: &SignedRequest<'_>, timestamp: i64, nonce: &str) -> String {
    format!("{VERSION}={}", hex::encode(mac_v2(secret, request, timestamp, nonce).finalize().into_bytes()))
}

/// The MAC of `request`'s canonical string, that [`sign`] makes and a verifier checks.
fn mac_v2(secret: &[u8], request: &SignedRequest<'_>, timestamp: i64, nonce: &str) -> Hmac<Sha256> {
    let mut m = mac(secret);
    m.update(request.canonical(timestamp, nonce).as_bytes());
    m
}

/// The signature headers of `request`, signed now with a new nonce: `X-Timestamp`, `X-Nonce`
/// and `X-Signature`, as [`HmacVerifier::verify_request`] checks them. The request must carry
/// its `tenant_slug` as `X-Tenant-Slug`.
pub fn signature_headers(secret: &[u8], request: &SignedRequest<'_>) -> [(&'static str, String); 3] {
    let ts = now_secs();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let signature = sign(secret, request, ts, &nonce);
    [(TIMESTAMP_HEADER, ts.to_string()), (NONCE_HEADER, nonce), (SIGNATURE_HEADER, signature)]
}

/// The legacy v1 signature: hex HMAC-SHA256 of `"{timestamp}.{signed}"`, where `signed` was
/// the body, or the target of a bodiless request. Only for talking to, or testing, a verifier
/// built [`accepting_v1`](HmacVerifier::accepting_v1); it does not cover the method or path.
pub fn sign_v1(secret: &[u8], timestamp: i64, signed: &[u8]) -> String {
    hex::encode(mac_v1(secret, timestamp, signed).finalize().into_bytes())
}

/// The MAC of `"{timestamp}.{signed}"`, v1's string, that [`sign_v1`] makes and a verifier
/// accepting v1 checks.
fn mac_v1(secret: &[u8], timestamp: i64, signed: &[u8]) -> Hmac<Sha256> {
    let mut m = mac(secret);
    m.update(timestamp.to_string().as_bytes());
    m.update(b".");
    m.update(signed);
    m
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Verifies signed requests: what a receiving side (a backend's `/internal/chatbot/**`, or the
/// chat service in `hmac` mode) checks, with that direction's secret.
pub struct HmacVerifier {
    secret: Vec<u8>,
    replay: Arc<dyn ReplayStore>,
    accept_v1: bool,
}

impl HmacVerifier {
    /// A verifier for `secret`, accepting v2 only, remembering nonces in this process
    /// ([`MemoryReplayStore`] of the default capacity). Replicas share a store instead
    /// ([`with_replay_store`](Self::with_replay_store)).
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Self { secret: secret.into(), replay: Arc::new(MemoryReplayStore::default()), accept_v1: false }
    }

    /// Claims nonces in `store` (a [`PostgresReplayStore`](super::replay::PostgresReplayStore)
    /// shared by replicas: a request accepted by one is a replay to all).
    pub fn with_replay_store(mut self, store: Arc<dyn ReplayStore>) -> Self {
        self.replay = store;
        self
    }

    /// Also accepts v1 signatures when `accept` (default: refused): for a migration window
    /// while callers still sign v1 (docs/service.md, "Switching to v2"). v1 covers only the
    /// timestamp and the body (or a bodiless request's target), so until this is off again a
    /// captured v1 request can be presented as another call.
    pub fn accepting_v1(mut self, accept: bool) -> Self {
        self.accept_v1 = accept;
        self
    }

    /// Whether v1 signatures are accepted.
    pub fn accepts_v1(&self) -> bool {
        self.accept_v1
    }

    /// Accepts `request` with `signature` (`X-Signature`) made at `timestamp` (`X-Timestamp`)
    /// with `nonce` (`X-Nonce`), within [`HMAC_WINDOW`] of `now`, whose nonce is claimed for
    /// the first time. The MAC is checked (in constant time) before anything is recorded, so
    /// only holders of the secret can fill the replay store.
    ///
    /// # Errors
    /// The reason it is refused, or [`SignatureError::ReplayStore`] when that cannot be known.
    pub async fn verify(
        &self,
        request: &SignedRequest<'_>,
        timestamp: &str,
        nonce: Option<&str>,
        signature: &str,
        now: i64,
    ) -> Result<(), SignatureError> {
        let ts: i64 = timestamp.trim().parse().map_err(|_| SignatureError::Malformed("X-Timestamp"))?;
        if now.abs_diff(ts) > HMAC_WINDOW.as_secs() {
            return Err(SignatureError::Stale);
        }
        let signature = signature.trim();
        let key = match signature.split_once('=') {
            Some((VERSION, given)) => {
                let nonce = nonce.map(str::trim).ok_or(SignatureError::Unsigned)?;
                if !NONCE_LEN.contains(&nonce.len())
                    || !nonce.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(SignatureError::Malformed("X-Nonce"));
                }
                let given = hex::decode(given).map_err(|_| SignatureError::Malformed("X-Signature"))?;
                // `verify_slice` compares in constant time.
                mac_v2(&self.secret, request, ts, nonce).verify_slice(&given).map_err(|_| SignatureError::Mismatch)?;
                format!("{VERSION}:{nonce}")
            }
            Some(_) => return Err(SignatureError::Malformed("X-Signature")),
            None if !self.accept_v1 => return Err(SignatureError::V1Refused),
            None => {
                let given = hex::decode(signature).map_err(|_| SignatureError::Malformed("X-Signature"))?;
                let signed = if request.body.is_empty() { request.target.as_bytes() } else { request.body };
                mac_v1(&self.secret, ts, signed).verify_slice(&given).map_err(|_| SignatureError::Mismatch)?;
                // v1 has no nonce: the signature is the request's identity.
                format!("v1:{}", signature.to_ascii_lowercase())
            }
        };
        // Kept until the timestamp leaves the window: from then on the request is stale anyway,
        // so forgetting it reopens nothing.
        let expires_at = ts + HMAC_WINDOW.as_secs() as i64;
        if self.replay.claim(&key, expires_at, now).await? { Ok(()) } else { Err(SignatureError::Replayed) }
    }

    /// [`verify`](Self::verify) for a whole request: `X-Timestamp`, `X-Nonce`, `X-Signature`
    /// and `X-Tenant-Slug` from `headers`, over `method`, `target` (path and query, as on the
    /// request line) and `body`.
    ///
    /// # Errors
    /// As [`verify`](Self::verify); [`SignatureError::Unsigned`] when a header is missing.
    pub async fn verify_request(
        &self,
        method: &http::Method,
        headers: &HeaderMap,
        target: &str,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let header = |name: &'static str| match headers.get(name) {
            None => Ok(None),
            Some(v) => v.to_str().map(Some).map_err(|_| SignatureError::Malformed(name)),
        };
        let (Some(ts), Some(signature)) = (header(TIMESTAMP_HEADER)?, header(SIGNATURE_HEADER)?) else {
            return Err(SignatureError::Unsigned);
        };
        let request = SignedRequest { method: method.as_str(), target, tenant_slug: header(TENANT_HEADER)?, body };
        self.verify(&request, ts, header(NONCE_HEADER)?, signature, now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;
    const NONCE: &str = "0123456789abcdef";
    const KEY: &[u8] = b"shared-secret";

    fn request<'a>(method: &'a str, target: &'a str, body: &'a [u8]) -> SignedRequest<'a> {
        SignedRequest { method, target, tenant_slug: Some("demo"), body }
    }

    /// Verifies `request` under the headers `signed` was signed with (its timestamp, nonce
    /// and signature), as a captured request presented as `request`.
    async fn present(
        v: &HmacVerifier,
        signed: &SignedRequest<'_>,
        request: &SignedRequest<'_>,
    ) -> Result<(), SignatureError> {
        let signature = sign(KEY, signed, NOW, NONCE);
        v.verify(request, &NOW.to_string(), Some(NONCE), &signature, NOW).await
    }

    #[test]
    fn the_canonical_string_names_every_part() {
        let r = SignedRequest {
            method: "GET",
            target: "/internal/chatbot/schema?tenantId=1&b=x+y&a=%7e&a=2",
            tenant_slug: Some("demo"),
            body: b"",
        };
        let expected = "v2\nGET\n/internal/chatbot/schema\na=~&a=2&b=x%20y&tenantId=1\ndemo\n1800000000\n\
             0123456789abcdef\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(r.canonical(NOW, NONCE), expected);
        // No part can carry the separator.
        let r = SignedRequest { method: "GET\n", target: "/a\nb?x=\n", tenant_slug: Some("de\nmo"), body: b"" };
        assert_eq!(r.canonical(NOW, "n\n").lines().count(), 8);
        assert_eq!(sign(KEY, &r, NOW, NONCE).len(), 3 + 64);
    }

    #[test]
    fn normalising_keeps_apart_what_a_handler_reads_apart() {
        let c = |target: &str| request("GET", target, b"").canonical(NOW, NONCE);
        // The same request, differently encoded.
        assert_eq!(c("/a/b%20c?x=1"), c("/a/b c?x=1"));
        assert_eq!(c("/a/%7Eb"), c("/a/~b"));
        assert_eq!(c("/a?x=%41"), c("/a?x=A"));
        assert_eq!(c("/a?x=a+b"), c("/a?x=a%20b"));
        assert_eq!(c("/a?y=2&x=1"), c("/a?x=1&y=2"));
        assert_eq!(c("/a?flag&&x=1"), c("/a?flag=&x=1"));
        // Different requests.
        assert_ne!(c("/a/b"), c("/a%2Fb"), "an escaped slash is no separator");
        assert_ne!(c("/a?x=a+b"), c("/a?x=a%2Bb"), "a plus is a space, an escaped plus a plus");
        assert_ne!(c("/a?x=1&x=2"), c("/a?x=2&x=1"), "repeated names keep their order");
        assert_ne!(c("/a?x=1&y=2"), c("/a?x=1%26y%3D2"), "an escaped & is data");
        assert_ne!(c("/a?x=1"), c("/a/?x=1"));
    }

    #[tokio::test]
    async fn a_request_verifies_once_and_not_stale_tampered_or_malformed() {
        let v = HmacVerifier::new(KEY.to_vec());
        let body = br#"{"tenantId":7}"#;
        let r = request("POST", "/internal/chatbot/conversations", body);
        assert_eq!(present(&v, &r, &r).await, Ok(()));
        assert_eq!(present(&v, &r, &r).await, Err(SignatureError::Replayed));
        let ts = NOW.to_string();
        let signature = sign(KEY, &r, NOW, "another-nonce-0001");
        // The window, either side.
        for off in [-301, 301] {
            let late = v.verify(&r, &ts, Some("another-nonce-0001"), &signature, NOW + off).await;
            assert_eq!(late, Err(SignatureError::Stale), "{off}");
        }
        assert_eq!(
            v.verify(&r, "i64::MIN", Some("x"), &signature, NOW).await,
            Err(SignatureError::Malformed("X-Timestamp"))
        );
        let far = i64::MIN.to_string();
        assert_eq!(v.verify(&r, &far, Some("x"), &signature, NOW).await, Err(SignatureError::Stale), "no overflow");
        assert_eq!(v.verify(&r, &ts, None, &signature, NOW).await, Err(SignatureError::Unsigned));
        for nonce in ["short", "with space 000000", &"n".repeat(65)] {
            let r2 = v.verify(&r, &ts, Some(nonce), &sign(KEY, &r, NOW, nonce), NOW).await;
            assert_eq!(r2, Err(SignatureError::Malformed("X-Nonce")), "{nonce}");
        }
        assert_eq!(v.verify(&r, &ts, Some(NONCE), "v2=zz", NOW).await, Err(SignatureError::Malformed("X-Signature")));
        assert_eq!(v.verify(&r, &ts, Some(NONCE), "v3=00", NOW).await, Err(SignatureError::Malformed("X-Signature")));
        let other_key = sign(b"other", &r, NOW, "another-nonce-0002");
        assert_eq!(v.verify(&r, &ts, Some("another-nonce-0002"), &other_key, NOW).await, Err(SignatureError::Mismatch));
        // A refused request records nothing: signed properly, that nonce is still new.
        let good = sign(KEY, &r, NOW, "another-nonce-0002");
        assert_eq!(v.verify(&r, &ts, Some("another-nonce-0002"), &good, NOW).await, Ok(()));
    }

    #[tokio::test]
    async fn every_part_of_the_request_is_signed() {
        let v = HmacVerifier::new(KEY.to_vec());
        let signed = request("POST", "/internal/chatbot/history?conversationId=1", b"{}");
        let mut other_slug = signed;
        other_slug.tenant_slug = Some("acme");
        let mut no_slug = signed;
        no_slug.tenant_slug = None;
        for (what, r) in [
            ("method", request("PUT", "/internal/chatbot/history?conversationId=1", b"{}")),
            ("path", request("POST", "/internal/chatbot/histories?conversationId=1", b"{}")),
            ("query", request("POST", "/internal/chatbot/history?conversationId=2", b"{}")),
            ("query added", request("POST", "/internal/chatbot/history?conversationId=1&all=1", b"{}")),
            ("body", request("POST", "/internal/chatbot/history?conversationId=1", b"{ }")),
            ("no body", request("POST", "/internal/chatbot/history?conversationId=1", b"")),
            ("slug", other_slug),
            ("no slug", no_slug),
        ] {
            assert_eq!(present(&v, &signed, &r).await, Err(SignatureError::Mismatch), "{what}");
        }
        let signature = sign(KEY, &signed, NOW, NONCE);
        let ts = (NOW + 1).to_string();
        assert_eq!(v.verify(&signed, &ts, Some(NONCE), &signature, NOW).await, Err(SignatureError::Mismatch), "time");
        let nonce = Some("0123456789abcdeF");
        assert_eq!(v.verify(&signed, &NOW.to_string(), nonce, &signature, NOW).await, Err(SignatureError::Mismatch));
        assert_eq!(present(&v, &signed, &signed).await, Ok(()));
    }

    /// The three cross-uses a v1 signature allowed (docs/service.md), each against a verifier
    /// that never saw the original (it was intercepted, or went to another replica).
    #[tokio::test]
    async fn a_signature_is_not_another_call() {
        // A signed GET's target as the body of `DELETE /api/chatbot/tenants/7`.
        let get = request("GET", "/api/chatbot/runs/r1/events?tenantId=7&userId=1", b"");
        let delete = request("DELETE", "/api/chatbot/tenants/7", get.target.as_bytes());
        assert_eq!(present(&HmacVerifier::new(KEY.to_vec()), &get, &delete).await, Err(SignatureError::Mismatch));
        // A `conversations/list` body as a `delete/user` call.
        let body = br#"{"nonce":"n","tenantId":7,"userId":101,"limit":20}"#;
        let list = request("POST", "/internal/chatbot/conversations/list", body);
        let delete_user = request("POST", "/internal/chatbot/delete/user", body);
        assert_eq!(present(&HmacVerifier::new(KEY.to_vec()), &list, &delete_user).await, Err(SignatureError::Mismatch));
        // An approved `send_sms` as `send_telegram`.
        let body = br#"{"tenantSlug":"demo","tenantId":1,"userId":1,"callId":"c1","arguments":{"to":"5A"}}"#;
        let sms = request("POST", "/internal/chatbot/tools/send_sms", body);
        let telegram = request("POST", "/internal/chatbot/tools/send_telegram", body);
        assert_eq!(present(&HmacVerifier::new(KEY.to_vec()), &sms, &telegram).await, Err(SignatureError::Mismatch));
    }

    #[tokio::test]
    async fn v1_is_refused_unless_accepted_for_a_migration() {
        let v = HmacVerifier::new(KEY.to_vec());
        let r = request("POST", "/internal/chatbot/conversations", b"{}");
        let old = sign_v1(KEY, NOW, b"{}");
        assert!(!v.accepts_v1());
        assert_eq!(v.verify(&r, &NOW.to_string(), None, &old, NOW).await, Err(SignatureError::V1Refused));
        let v = HmacVerifier::new(KEY.to_vec()).accepting_v1(true);
        assert_eq!(v.verify(&r, &NOW.to_string(), None, &old, NOW).await, Ok(()));
        assert_eq!(v.verify(&r, &NOW.to_string(), None, &old, NOW).await, Err(SignatureError::Replayed));
        // A bodiless v1 request signed its target.
        let get = request("GET", "/internal/chatbot/history?conversationId=1", b"");
        let old = sign_v1(KEY, NOW, get.target.as_bytes());
        assert_eq!(v.verify(&get, &NOW.to_string(), None, &old, NOW).await, Ok(()));
        // v2 still works beside it.
        assert_eq!(present(&v, &r, &r).await, Ok(()));
    }

    #[tokio::test]
    async fn verifiers_sharing_a_store_accept_a_request_once() {
        let store: Arc<dyn ReplayStore> = Arc::new(MemoryReplayStore::default());
        let a = HmacVerifier::new(KEY.to_vec()).with_replay_store(Arc::clone(&store));
        let b = HmacVerifier::new(KEY.to_vec()).with_replay_store(store);
        let r = request("POST", "/internal/chatbot/turns/end", b"{}");
        assert_eq!(present(&a, &r, &r).await, Ok(()));
        assert_eq!(present(&b, &r, &r).await, Err(SignatureError::Replayed), "the other replica");
    }

    /// A full memory store refuses new requests (503, the signer retries) rather than forget
    /// an accepted one; the old one is still a replay after many more.
    #[tokio::test]
    async fn a_replay_after_the_memory_cap_is_refused() {
        let v = HmacVerifier::new(KEY.to_vec()).with_replay_store(Arc::new(MemoryReplayStore::new(100)));
        let first = request("POST", "/internal/chatbot/delete/tenant", br#"{"tenantId":7}"#);
        assert_eq!(present(&v, &first, &first).await, Ok(()));
        let mut refused = 0;
        for i in 0..150 {
            let body = format!("{{\"i\":{i}}}");
            let r = request("POST", "/internal/chatbot/save-message", body.as_bytes());
            let nonce = format!("nonce-{i:012}");
            match v.verify(&r, &NOW.to_string(), Some(&nonce), &sign(KEY, &r, NOW, &nonce), NOW).await {
                Ok(()) => {}
                Err(e) => {
                    assert!(e.is_unavailable(), "{e}");
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 51, "the store holds 100: the first and 99 more");
        assert_eq!(present(&v, &first, &first).await, Err(SignatureError::Replayed), "after the cap");
        // Past the window the nonces go, and there is room again.
        let later = NOW + 301;
        let r = request("POST", "/internal/chatbot/save-message", b"{}");
        let signature = sign(KEY, &r, later, NONCE);
        assert_eq!(v.verify(&r, &later.to_string(), Some(NONCE), &signature, later).await, Ok(()));
    }

    #[tokio::test]
    async fn a_whole_request_is_read_from_its_headers() {
        let v = HmacVerifier::new(KEY.to_vec());
        let target = "/internal/chatbot/schema?tenantId=1&nonce=n1";
        let r = request("GET", target, b"");
        let mut h = HeaderMap::new();
        let now = now_secs();
        assert_eq!(v.verify_request(&http::Method::GET, &h, target, b"", now).await, Err(SignatureError::Unsigned));
        for (name, value) in signature_headers(KEY, &r) {
            h.insert(name, value.parse().unwrap());
        }
        // The slug is signed: without its header the request is another.
        assert_eq!(v.verify_request(&http::Method::GET, &h, target, b"", now).await, Err(SignatureError::Mismatch));
        h.insert(TENANT_HEADER, "demo".parse().unwrap());
        assert_eq!(v.verify_request(&http::Method::POST, &h, target, b"", now).await, Err(SignatureError::Mismatch));
        assert_eq!(v.verify_request(&http::Method::GET, &h, target, b"", now).await, Ok(()));
        assert_eq!(v.verify_request(&http::Method::GET, &h, target, b"", now).await, Err(SignatureError::Replayed));
    }
}
