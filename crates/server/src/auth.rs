//! Request authentication: `none` (an internal service behind a backend, as the academy
//! admin runs), `api_key` (per-tenant keys, stored as SHA-256 hashes) and `hmac` (the caller
//! signs the request with a shared secret — the scheme of the backend callbacks, from the
//! conversations crate's `backend::signing`).
//!
//! Authentication answers *who* is asking ([`Caller`]); authorization of the numeric tenant
//! they ask to act on happens once, in [`Caller::admit`] (or [`Caller::admit_tenant`] for a
//! tenant as a whole), on the ids the handler's extractor parsed — a body's `tenantId`, a
//! query's, a path's or a header's ([`crate::extract`]) — so the value checked is the value
//! acted on, and the [`Principal`] it returns is what the service takes. (`/search` and `/mcp`
//! name a tenant by its slug only, which the key itself opens.) A second,
//! looser reading of a request (the body as a JSON value, say) is what let a body the check
//! could not read — an array, trailing bytes — through to a handler that could
//! (docs/reliability.md).
//!
//! Comparisons are constant-time; an HMAC signature is accepted once within its window, so
//! a captured request cannot be replayed.

use crate::error::ApiError;
use axum::http::{HeaderMap, Method, StatusCode};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use subtle::ConstantTimeEq;
pub use toolgraph_conversations::backend::replay::{MemoryReplayStore, PostgresReplayStore, ReplayStore};
pub use toolgraph_conversations::backend::signing::{
    HmacVerifier, SignatureError, SignedRequest, now_secs, sign, sign_v1, signature_headers,
};
use toolgraph_protocol::{TenantId, UserId};

/// How requests prove who sent them.
pub enum Auth {
    /// Trust the network (an internal service behind a backend).
    None,
    /// `Authorization: Bearer <key>`; keys by tenant slug, stored as SHA-256 digests.
    ApiKey(ApiKeys),
    /// `X-Signature: v2=<hex>` with `X-Timestamp` and `X-Nonce`: HMAC-SHA256 of the method, path,
    /// query, tenant slug and body digest (docs/service.md, "Signed requests").
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
    /// request whose body, query or path names another `tenantId` than its key's, on a route
    /// that acts on it, gets 403 ([`Caller::admit`]).
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

    /// Authenticates a request from its method, headers, target (path and query) and body.
    /// The ids it names are admitted against the returned [`Caller`] by the extractor that
    /// parses them ([`Caller::admit`]).
    pub async fn check(
        &self,
        method: &Method,
        headers: &HeaderMap,
        target: &str,
        body: &[u8],
    ) -> Result<Caller, ApiError> {
        match self {
            Self::None => Ok(Caller::default()),
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
                Ok(Caller { bound: keys.tenant_ids.get(slug).map(|&id| (slug.to_owned(), id)) })
            }
            Self::Hmac(v) => {
                // v2 signs the method, target, tenant slug and body; the nonce is claimed in the
                // verifier's replay store (shared by replicas on PostgreSQL), else 503.
                v.verify_request(method, headers, target, body, now_secs()).await.map_err(|e| signature_refusal(&e))?;
                Ok(Caller::default())
            }
        }
    }
}

/// Who a request was authenticated as: put in the request's extensions by the service's
/// authentication layer, read by the extractors, which admit the ids a request names through
/// it ([`Caller::admit`]).
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// The tenant slug and the one numeric tenant id its `api_key` opens, when bound
    /// (`[server.api_key_tenants]`); otherwise the ids are the caller's word (`none`, `hmac`,
    /// or keys explicitly left unbound).
    bound: Option<(String, i64)>,
}

impl Caller {
    /// A caller whose key opens `tenant_id` only (tests and embedders that authenticate
    /// themselves).
    pub fn bound_to(slug: impl Into<String>, tenant_id: i64) -> Self {
        Self { bound: Some((slug.into(), tenant_id)) }
    }

    /// The numeric tenant id the caller's key is bound to, if any.
    pub fn bound_tenant(&self) -> Option<i64> {
        self.bound.as_ref().map(|(_, id)| *id)
    }

    /// The one check of who may act on what: `user` of `tenant`, if the caller may act on
    /// that tenant (403 when its key is bound to another). Every door's extractor ends here,
    /// on the very ids its handler then acts on, and the service takes nothing else.
    ///
    /// # Errors
    /// 403 naming the key's tenant.
    pub fn admit(&self, tenant: TenantId, user: UserId) -> Result<Principal, ApiError> {
        self.admit_tenant(tenant)?;
        Ok(Principal { tenant, user })
    }

    /// Tenant `tenant` as a whole (deleting it), if the caller may act on it; as
    /// [`Caller::admit`].
    ///
    /// # Errors
    /// 403 naming the key's tenant.
    pub fn admit_tenant(&self, tenant: TenantId) -> Result<AdmittedTenant, ApiError> {
        match &self.bound {
            Some((slug, own)) if *own != tenant.0 => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("the API key of tenant '{slug}' opens tenant id {own} only"),
            )),
            _ => Ok(AdmittedTenant(tenant)),
        }
    }
}

/// Who is asking, checked: a person of a tenant the request's caller may act on. Made only by
/// [`Caller::admit`]; every [`ChatService`](crate::ChatService) method that reads or changes a
/// person's data takes one, so a route cannot reach their data without the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal {
    tenant: TenantId,
    user: UserId,
}

impl Principal {
    /// The tenant.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// The person.
    pub fn user(&self) -> UserId {
        self.user
    }

    /// (tenant, user) as the stores key them.
    pub(crate) fn ids(&self) -> (i64, i64) {
        (self.tenant.0, self.user.0)
    }
}

/// A tenant the caller may act on as a whole, checked: made only by [`Caller::admit_tenant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmittedTenant(TenantId);

impl AdmittedTenant {
    /// The tenant.
    pub fn id(&self) -> TenantId {
        self.0
    }
}

/// `api_key` mode's keys: tenant slug → SHA-256 of the key, and the tenant ids bound to slugs.
pub struct ApiKeys {
    keys: HashMap<String, [u8; 32]>,
    tenant_ids: HashMap<String, i64>,
}

/// The 401 answer to a request whose signature failed for `reason`.
pub(crate) fn bad_signature(reason: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, format!("bad signature: {reason}"))
}

/// Longest a client may take to send a request's body; a slower one gets 408 and its
/// connection and buffer back to the service.
pub(crate) const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The slowest upload a large body may arrive at, in bytes per second: a route that takes
/// large bodies (a document upload) gives the client that much longer.
const SLOWEST_BYTES_PER_SECOND: u64 = 128 * 1024;

/// How long a body of at most `max` bytes may take to arrive: [`BODY_READ_TIMEOUT`], plus the
/// time `max` bytes take at [`SLOWEST_BYTES_PER_SECOND`] past the first MiB.
pub(crate) fn body_read_timeout(max: usize) -> std::time::Duration {
    let beyond = (max as u64).saturating_sub(1 << 20);
    BODY_READ_TIMEOUT + std::time::Duration::from_secs(beyond / SLOWEST_BYTES_PER_SECOND)
}

/// Reads the body of `req` (at most `max` bytes, else 413; within [`body_read_timeout`], else
/// 408), has `check` judge the headers, the target (path and query) and the body, and gives the
/// request back whole with what `check` found. Signatures cover the body, so a checking middleware must read it before
/// the handler does.
pub(crate) async fn check_whole_request<T>(
    req: axum::extract::Request,
    max: usize,
    check: impl AsyncFnOnce(&HeaderMap, &str, &[u8]) -> Result<T, ApiError>,
) -> Result<(axum::extract::Request, T), ApiError> {
    let (parts, body) = req.into_parts();
    let limit = body_read_timeout(max);
    let bytes = tokio::time::timeout(limit, axum::body::to_bytes(body, max))
        .await
        .map_err(|_| {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, format!("the body took longer than {limit:?} to arrive"))
        })?
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than {max} bytes")))?;
    let target = parts.uri.path_and_query().map_or(parts.uri.path(), |pq| pq.as_str());
    let found = check(&parts.headers, target, &bytes).await?;
    Ok((axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes)), found))
}

/// The SHA-256 digest of an API key, as `[server.api_keys]` stores it (hex).
pub fn hash_api_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The answer to a request whose signature was not accepted: 401 naming the reason, or 503
/// with `Retry-After` when the replay store could not tell whether it is a replay (the request
/// may be good; the signer sends it again, newly signed).
pub(crate) fn signature_refusal(e: &SignatureError) -> ApiError {
    if !e.is_unavailable() {
        return bad_signature(&e.to_string());
    }
    tracing::warn!(error = %e, "a signed request could not be checked for replay");
    let mut refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cannot check the signature now; try again");
    refused.retry_after = Some(1);
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_gets_longer_to_arrive() {
        assert_eq!(body_read_timeout(64 * 1024), BODY_READ_TIMEOUT);
        assert_eq!(body_read_timeout(1 << 20), BODY_READ_TIMEOUT);
        assert_eq!(body_read_timeout(8 << 20), std::time::Duration::from_secs(76));
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
        // `check` awaits nothing outside `hmac` mode.
        let check = |target: &str| futures::executor::block_on(auth.check(&Method::GET, &headers, target, b""));
        // What a request names is admitted against the caller returned, by its extractor.
        let caller = check("/api/chatbot/stream").unwrap();
        assert_eq!(caller.bound_tenant(), Some(7));
        let who = caller.admit(TenantId(7), UserId(3)).unwrap();
        assert_eq!((who.tenant(), who.user()), (TenantId(7), UserId(3)));
        assert_eq!(caller.admit(TenantId(8), UserId(3)).unwrap_err().status, StatusCode::FORBIDDEN);
        assert_eq!(caller.admit_tenant(TenantId(7)).unwrap().id(), TenantId(7));
        assert_eq!(caller.admit_tenant(TenantId(8)).unwrap_err().status, StatusCode::FORBIDDEN);
        assert!(auth.unbound_slugs().is_empty());
        let unbound = Auth::api_keys([(&"demo".to_string(), &hash_api_key("k-1"))]).unwrap();
        assert_eq!(unbound.unbound_slugs(), ["demo"]);
        assert!(
            futures::executor::block_on(unbound.check(&Method::GET, &headers, "/x", b""))
                .unwrap()
                .admit(TenantId(8), UserId(1))
                .is_ok()
        );
        assert!(unbound.bind_tenant_ids([(&"acme".to_string(), &3)]).is_err(), "a slug without a key");
        assert!(
            futures::executor::block_on(Auth::None.check(&Method::GET, &headers, "/x", b""))
                .unwrap()
                .bound_tenant()
                .is_none()
        );
    }

    #[test]
    fn api_keys_are_checked_against_their_hash() {
        let auth = Auth::api_keys([(&"demo".to_string(), &hash_api_key("k-123"))]).unwrap();
        assert!(Auth::api_keys([(&"x".to_string(), &"not hex".to_string())]).err().is_some_and(|e| e.contains("'x'")));
        let mut h = HeaderMap::new();
        h.insert("x-tenant-slug", "demo".parse().unwrap());
        assert!(futures::executor::block_on(auth.check(&Method::POST, &h, "/api/chatbot/stream", b"")).is_err());
        h.insert("authorization", "Bearer k-124".parse().unwrap());
        assert_eq!(
            futures::executor::block_on(auth.check(&Method::POST, &h, "/api/chatbot/stream", b"")).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        h.insert("authorization", "Bearer k-123".parse().unwrap());
        assert!(futures::executor::block_on(auth.check(&Method::POST, &h, "/api/chatbot/stream", b"")).is_ok());
        h.insert("x-tenant-slug", "other".parse().unwrap());
        assert!(
            futures::executor::block_on(auth.check(&Method::POST, &h, "/api/chatbot/stream", b"")).is_err(),
            "a key opens its own tenant only"
        );
    }
}
