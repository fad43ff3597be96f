//! Request parsing with errors that name the offending field, and who is asking, admitted once
//! against the authenticated caller wherever a request names them: [`Authorized`] (a body
//! parsed once, strictly), [`QueryAsker`] (a query), [`asking`] (the headers of the doors whose
//! bodies do not say).

use crate::auth::{Caller, Principal};
use crate::error::ApiError;
use crate::wire::{AskerQuery, TenantScoped};
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::error::Category;
use toolgraph_protocol::TenantId;

/// Largest request body accepted (a 4,000-character message is at most 16 KB).
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// The most a request of a door whose clients send the whole conversation each time may carry
/// (OpenAI's chat completions, AG-UI: every message and tool result so far); the turn's own
/// message stays within the contract's limit.
pub(crate) const MAX_CONVERSATION_BODY: usize = 4 * 1024 * 1024;
/// Parses a JSON body: exactly one JSON object with nothing but whitespace after it, else 400
/// (an array would fill a struct by position, and trailing bytes would let another reader see
/// another request); a missing, duplicated or mistyped field is 422 naming it.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().copied().find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(b'{') {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "malformed JSON: the body must be one JSON object"));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let text = inner.to_string();
        let text = text.split(" at line ").next().unwrap_or(&text).to_owned();
        match inner.classify() {
            Category::Data => {
                // A missing field is reported at the parent path with the name in the text.
                let field = if path == "." { text.split('`').nth(1).unwrap_or("body").to_owned() } else { path };
                ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, field, text)
            }
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {text}"))
            }
        }
    })?;
    de.end().map_err(|_| {
        ApiError::new(StatusCode::BAD_REQUEST, "malformed JSON: the body must be one JSON object with nothing after it")
    })?;
    Ok(value)
}

/// A JSON body parsed with [`json_body`], and who it says is asking admitted against the
/// request's [`Caller`] ([`Caller::admit`]): the ids checked are the ids the handler acts on,
/// since both read the same value. A route outside the authentication layer has no caller and
/// is refused (500): authorization never defaults to open.
pub struct Authorized<T>(pub Principal, pub T);

impl<T: DeserializeOwned + TenantScoped> Authorized<T> {
    /// Parses `bytes` and admits who they say is asking for `caller`.
    ///
    /// # Errors
    /// 400 or 422 for a body that is not one object of `T`'s fields, 403 for another tenant.
    pub fn parse(caller: &Caller, bytes: &[u8]) -> Result<Self, ApiError> {
        let value: T = json_body(bytes)?;
        let (tenant, user) = value.asker();
        Ok(Self(caller.admit(tenant, user)?, value))
    }
}

impl<S: Send + Sync, T: DeserializeOwned + TenantScoped> FromRequest<S> for Authorized<T> {
    type Rejection = ApiError;

    async fn from_request(mut req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The body is the last thing read of the request: the caller is taken, not copied.
        let caller = req.extensions_mut().remove::<Caller>().ok_or_else(outside_authentication)?;
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}")))?;
        Self::parse(&caller, &bytes)
    }
}

/// 500: a route that acts for someone is served outside the authentication layer (a wiring
/// mistake; never a default of open).
fn outside_authentication() -> ApiError {
    ApiError::internal("a tenant-scoped route is served outside the authentication layer")
}

/// The [`Caller`] the authentication layer found.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(outside_authentication)
    }
}

/// A path's parameters, read as [`Path`](axum::extract::Path) reads them, refused in the
/// service's error shape (400 naming what is wrong) rather than axum's plain text.
pub struct PathIds<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathIds<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(ids) = axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
        Ok(Self(ids))
    }
}

/// A query, read as [`Query`] reads it, refused in the service's error shape (400).
pub struct QueryOf<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryOf<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(q) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
        Ok(Self(q))
    }
}

/// Who is asking on a route that names them in its query (`?tenantId=&userId=`), admitted
/// ([`Caller::admit`]). The query is read as the handler would read it — percent-decoded, a
/// repeated name refused (400) — so what is checked is what is acted on.
pub struct QueryAsker(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for QueryAsker {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let QueryOf(q) = QueryOf::<AskerQuery>::from_request_parts(parts, state).await?;
        Ok(Self(caller.admit(q.tenant_id, q.user_id)?))
    }
}

/// Who is asking on a door whose body does not name the tenant (OpenAI's chat completions,
/// AG-UI, LangGraph's threads and runs): the tenant of `X-Tenant-Slug`, its numeric id from the
/// caller's bound key or `X-Tenant-Id`, and the person of `X-User-Id` (else `user`, the body's
/// word for it), admitted ([`Caller::admit`]).
#[derive(Debug, Clone)]
pub struct Asking {
    /// The tenant's slug.
    pub tenant_slug: String,
    /// Who, checked.
    pub principal: Principal,
}

/// [`Asking`], from the request's headers, the authenticated `caller` and the body's `user`.
///
/// # Errors
/// 400 naming the header that is missing or not a number; 403 for a tenant id the key does not
/// open.
pub fn asking(caller: &Caller, headers: &HeaderMap, user: Option<&str>) -> Result<Asking, ApiError> {
    let bad = |field: &str, message: String| ApiError::field(StatusCode::BAD_REQUEST, field, message);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let tenant_slug = header("x-tenant-slug")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("X-Tenant-Slug", "the X-Tenant-Slug header is required: the tenant that is asking".into()))?
        .to_owned();
    let tenant = match (caller.bound_tenant(), header("x-tenant-id")) {
        (Some(bound), None) => TenantId(bound),
        (_, Some(id)) => {
            id.parse().map_err(|_| bad("X-Tenant-Id", format!("the X-Tenant-Id header is not a number: {id}")))?
        }
        (None, None) => {
            return Err(bad("X-Tenant-Id", "the X-Tenant-Id header is required: the tenant's numeric id".into()));
        }
    };
    let user = match header("x-user-id").or(user.map(str::trim)) {
        Some(u) => u.parse().map_err(|_| bad("user", format!("the user id is not a number: {u}")))?,
        None => {
            return Err(bad(
                "user",
                "the X-User-Id header (or `user`) is required: the numeric id of the person".into(),
            ));
        }
    };
    Ok(Asking { tenant_slug, principal: caller.admit(tenant, user)? })
}

/// `X-Tenant-Slug` must equal the body's `tenantSlug` (docs/service.md: else 400).
pub fn check_tenant_header(headers: &HeaderMap, tenant_slug: &str) -> Result<(), ApiError> {
    let header = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok());
    if header != Some(tenant_slug) {
        return Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "X-Tenant-Slug",
            "the X-Tenant-Slug header must equal tenantSlug",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::StreamRequest;

    #[test]
    fn errors_name_the_field() {
        let e =
            json_body::<StreamRequest>(br#"{"tenantSlug":"a","tenantId":"x","userId":1,"message":"m"}"#).unwrap_err();
        assert_eq!((e.status.as_u16(), e.field.as_deref()), (422, Some("tenantId")));
        let e = json_body::<StreamRequest>(br#"{"tenantSlug":"a","tenantId":1,"userId":1}"#).unwrap_err();
        assert_eq!((e.status.as_u16(), e.field.as_deref()), (422, Some("message")));
        let e = json_body::<StreamRequest>(br#"{"tenantSlug":"a", "#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
    }

    #[test]
    fn a_body_is_one_object_and_nothing_after_it() {
        let ok = br#" {"tenantSlug":"a","tenantId":7,"userId":1,"message":"m"} "#;
        assert_eq!(json_body::<StreamRequest>(ok).unwrap().tenant_id, TenantId(7));
        let status = |body: &[u8]| json_body::<StreamRequest>(body).err().map(|e| e.status.as_u16());
        assert_eq!(status(br#"["a",8,1,null,"m"]"#), Some(400), "an array fills a struct by position");
        assert_eq!(status(br#"{"tenantSlug":"a","tenantId":8,"userId":1,"message":"m"} x"#), Some(400));
        assert_eq!(status(br#"{"tenantSlug":"a","tenantId":8,"userId":1,"message":"m"}{"tenantId":7}"#), Some(400));
        assert_eq!(status(br#"{"tenantId":7,"tenantSlug":"a","tenantId":8,"userId":1,"message":"m"}"#), Some(422));
        assert_eq!(status(b"null"), Some(400));
        assert_eq!(status("\u{feff}{}".as_bytes()), Some(400));
        assert_eq!(status(b""), Some(400));
    }

    #[test]
    fn a_bound_caller_gets_its_own_tenant_or_403() {
        let caller = Caller::bound_to("demo", 7);
        let parse = |body: &[u8]| Authorized::<StreamRequest>::parse(&caller, body).map(|a| a.0.tenant());
        assert_eq!(parse(br#"{"tenantSlug":"demo","tenantId":7,"userId":1,"message":"m"}"#).unwrap(), TenantId(7));
        let e = parse(br#"{"tenantSlug":"demo","tenantId":8,"userId":1,"message":"m"}"#).unwrap_err();
        assert_eq!(e.status.as_u16(), 403);
        let open = Caller::default();
        assert!(
            Authorized::<StreamRequest>::parse(&open, br#"{"tenantSlug":"x","tenantId":8,"userId":1,"message":"m"}"#)
                .is_ok()
        );
    }
}

/// Hostile request bodies: any bytes, and any JSON with the contract's field names at any type,
/// give a 400 or a 422 naming a field — never a panic, never a 5xx — and what passes parsing
/// is judged by `validate`, which never panics either.
#[cfg(test)]
mod body_props {
    use super::*;
    use crate::wire::{ConfirmRequest, StreamRequest};
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,40}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    const FIELDS: [&str; 10] = [
        "tenantSlug",
        "tenantId",
        "userId",
        "conversationId",
        "message",
        "agent",
        "agentId",
        "context",
        "toolEvents",
        "messageId",
    ];

    /// An object over the contract's names (some missing, some of the wrong type) plus noise.
    fn body() -> impl Strategy<Value = Value> {
        (prop::collection::btree_map(prop::sample::select(&FIELDS[..]), json(), 0..10), json()).prop_map(
            |(fields, noise)| {
                let mut m: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                m.insert("noise".into(), noise);
                Value::Object(m)
            },
        )
    }

    fn judged(result: Result<(), ApiError>) {
        if let Err(e) = result {
            assert!(matches!(e.status.as_u16(), 400 | 413 | 422), "{} {}", e.status, e.message);
            assert!(!e.message.is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            judged(json_body::<StreamRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
            judged(json_body::<ConfirmRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
        }

        #[test]
        fn any_json_with_the_contracts_names(v in body()) {
            let bytes = serde_json::to_vec(&v).unwrap_or_default();
            judged(json_body::<StreamRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
            judged(json_body::<ConfirmRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
        }
    }
}
