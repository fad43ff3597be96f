//! [`AllowedHosts`]: the names the service answers to. A web page the user visits can point its
//! own name at 127.0.0.1 (DNS rebinding) and then call a local service as if same-origin; its
//! requests still carry the page's name in `Host` and `Origin`, so checking both against the
//! names the operator listed (`server.allowed_hosts`) closes that door on every route
//! (docs/reliability.md).

use crate::error::ApiError;
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use std::sync::Arc;

/// One allowed name: the host (lower-cased, without brackets) and, if it names one, the port.
type HostEntry = (String, Option<u16>);

/// The `Host` names (optionally with a port) requests may carry; `*` accepts any.
#[derive(Clone, Debug)]
pub struct AllowedHosts {
    /// `None`: any host.
    entries: Option<Arc<[HostEntry]>>,
}

impl Default for AllowedHosts {
    /// The loopback names: `localhost`, `127.0.0.1`, `::1`.
    fn default() -> Self {
        Self::new(["localhost", "127.0.0.1", "::1"])
    }
}

impl AllowedHosts {
    /// From `name` or `name:port` entries (an IPv6 address bare or bracketed); `*` accepts any
    /// host. Entries that are empty are skipped.
    pub fn new(entries: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        let mut parsed = Vec::new();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry == "*" {
                return Self::any();
            }
            if entry.is_empty() {
                continue;
            }
            let (host, port) = split_authority(entry).unwrap_or((bare(entry), None));
            parsed.push((host.to_ascii_lowercase(), port));
        }
        Self { entries: Some(parsed.into()) }
    }

    /// Any host (a proxy in front checks `Host` itself).
    pub fn any() -> Self {
        Self { entries: None }
    }

    /// Whether `authority` (`name`, `name:port`, `[v6]:port`) is allowed.
    pub fn allows(&self, authority: &str) -> bool {
        let Some(entries) = &self.entries else { return true };
        let Some((host, port)) = split_authority(authority) else { return false };
        // Entries are lower-cased once, when listed; a request's name is compared as it came.
        entries.iter().any(|(h, p)| h.eq_ignore_ascii_case(host) && p.is_none_or(|p| Some(p) == port))
    }

    /// Checks a request's `Host` (or its absolute URI's authority) and, when a browser sent
    /// one, its `Origin`.
    ///
    /// # Errors
    /// 403 naming the refused name and the setting that would admit it.
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
        if self.entries.is_none() {
            return Ok(());
        }
        let host =
            headers.get(header::HOST).and_then(|v| v.to_str().ok()).or_else(|| uri.authority().map(|a| a.as_str()));
        let refused = |what: &str, name: &str| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!("{what} '{name}' is not one of this service's names (server.allowed_hosts)"),
            )
        };
        match host {
            Some(host) if self.allows(host) => {}
            Some(host) => return Err(refused("Host", host)),
            None => return Err(ApiError::new(StatusCode::FORBIDDEN, "the request names no Host")),
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            // `scheme://authority`; `null` (sandboxed frames, files) names no host at all.
            let authority = origin.split_once("://").map(|(_, rest)| rest.trim_end_matches('/'));
            match authority {
                Some(a) if self.allows(a) => {}
                _ => return Err(refused("Origin", origin)),
            }
        }
        Ok(())
    }
}

/// `router` with every route checked against `hosts` first, but `/health` and `/ready` (an
/// orchestrator's probes reach them by address, and they answer nothing a page could use).
pub fn guard_hosts(router: Router, hosts: AllowedHosts) -> Router {
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        let hosts = hosts.clone();
        async move {
            let path = req.uri().path();
            if path == "/health" || path == "/ready" {
                return next.run(req).await;
            }
            match hosts.check(req.headers(), req.uri()) {
                Ok(()) => next.run(req).await,
                Err(e) => {
                    tracing::warn!(error = %e.message, "refused a request for another host (DNS rebinding?)");
                    e.into_response()
                }
            }
        }
    }))
}

/// The host without brackets or a trailing dot.
fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.')
}

/// `name[:port]`, `[v6][:port]` or a bare IPv6 address into its host (as written, without
/// brackets) and port.
fn split_authority(text: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((bare(host), port));
    }
    match text.rsplit_once(':') {
        // More than one colon and no brackets: a bare IPv6 address.
        Some((host, _)) if host.contains(':') => Some((bare(text), None)),
        Some((host, port)) => Some((bare(host), Some(port.parse().ok()?))),
        None => Some((bare(text), None)),
    }
    .filter(|(h, _)| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_the_listed_names_pass() {
        let hosts = AllowedHosts::default();
        let uri: Uri = "/api/chatbot/stream".parse().unwrap();
        let ok = |h: &[(&'static str, &str)]| hosts.check(&headers(h), &uri).is_ok();
        assert!(ok(&[("host", "127.0.0.1:8000")]));
        assert!(ok(&[("host", "localhost")]));
        assert!(ok(&[("host", "LOCALHOST.:9")]));
        assert!(ok(&[("host", "[::1]:8000")]));
        assert!(!ok(&[("host", "evil.example:8000")]), "a rebound name");
        assert!(!ok(&[("host", "127.0.0.1.evil.example")]));
        assert!(!ok(&[]), "no Host");
        assert!(ok(&[("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:8000")]), "the playground");
        assert!(!ok(&[("host", "127.0.0.1:8000"), ("origin", "http://evil.example")]), "another page");
        assert!(!ok(&[("host", "127.0.0.1:8000"), ("origin", "null")]));
        let err = hosts.check(&headers(&[("host", "evil.example")]), &uri).unwrap_err();
        assert_eq!(err.status, StatusCode::FORBIDDEN);
        assert!(err.message.contains("server.allowed_hosts"), "{}", err.message);
    }

    #[test]
    fn ports_ipv6_and_any() {
        let hosts = AllowedHosts::new(["tg.example.com:8443", "::1", "", "[fe80::1]"]);
        assert!(hosts.allows("tg.example.com:8443"));
        assert!(!hosts.allows("tg.example.com:8444"));
        assert!(!hosts.allows("tg.example.com"));
        assert!(hosts.allows("[::1]:1"));
        assert!(hosts.allows("[fe80::1]"));
        assert!(!hosts.allows("localhost"));
        assert!(!hosts.allows("tg.example.com:notaport"));
        assert!(AllowedHosts::new(["a", "*"]).allows("anything:1"));
        let uri: Uri = "/".parse().unwrap();
        assert!(AllowedHosts::any().check(&HeaderMap::new(), &uri).is_ok());
    }
}
